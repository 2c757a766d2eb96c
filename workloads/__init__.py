"""What runs on the cluster: RDMA network objects, NCCL installer, Lustre volume, secrets, identity, Ray."""
