"""The Cloud Storage bucket trained models are exported to, when the stack creates it."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.services import ProjectServices
from infra.settings import StorageSettings


@dataclass(frozen=True)
class ExportBucketArgs:
    settings: StorageSettings
    services: ProjectServices


class ExportBucket(pulumi.ComponentResource):
    bucket: gcp.storage.Bucket

    def __init__(self, name: str, args: ExportBucketArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:infra:ExportBucket", name, None, opts)
        # Uniform access: IAM alone decides who reads it (no per-object ACLs), and never public. Like Lustre, it holds
        # results: protected with protectData, and never emptied by a destroy.
        self.bucket = gcp.storage.Bucket(
            name,
            name=args.settings.export_bucket_name,
            project=args.settings.project,
            location=args.settings.region,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            force_destroy=False,
            opts=pulumi.ResourceOptions(
                parent=self, protect=args.settings.protect_data, depends_on=args.services.needed_by("storage")
            ),
        )
        self.register_outputs({"bucket": self.bucket.name})
