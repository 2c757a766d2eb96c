"""GCP infrastructure for NeMo RL on GKE: networks, cluster, GPU node pool, Managed Lustre."""
