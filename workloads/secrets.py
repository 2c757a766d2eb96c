"""The tokens the Ray pods need, as one Kubernetes Secret fed only from Pulumi secret config."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

HF_TOKEN_KEY = "HF_TOKEN"
WANDB_KEY = "WANDB_API_KEY"


def token_keys(has_wandb_key: bool) -> tuple[str, ...]:
    """The Secret's keys, which the Ray pods take as environment variables."""
    return (HF_TOKEN_KEY, WANDB_KEY) if has_wandb_key else (HF_TOKEN_KEY,)


@dataclass(frozen=True)
class TokensArgs:
    name: str
    namespace: pulumi.Input[str]
    hf_token: pulumi.Output[str]
    wandb_api_key: pulumi.Output[str] | None


class Tokens(pulumi.ComponentResource):
    """Pods read these through secretKeyRef; the values never appear in a pod spec, output or log."""

    secret: k8s.core.v1.Secret
    keys: tuple[str, ...]

    def __init__(self, name: str, args: TokensArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:Tokens", name, None, opts)
        data: dict[str, pulumi.Input[str]] = {HF_TOKEN_KEY: pulumi.Output.secret(args.hf_token)}
        if args.wandb_api_key is not None:
            data[WANDB_KEY] = pulumi.Output.secret(args.wandb_api_key)
        self.keys = token_keys(args.wandb_api_key is not None)
        self.secret = k8s.core.v1.Secret(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.name, namespace=args.namespace),
            type="Opaque",
            string_data=data,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["data", "stringData"]),
        )
        self.register_outputs({"name": self.secret.metadata.name, "keys": list(self.keys)})
