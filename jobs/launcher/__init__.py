"""The job stack: reads the infra stack and launches the NeMo RL GRPO pipeline as a Kubernetes Job."""
