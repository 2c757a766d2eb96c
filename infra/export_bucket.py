"""The Cloud Storage bucket trained models are exported to, when the stack creates it."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.services import ProjectServices


@dataclass(frozen=True)
class ExportBucketArgs:
    name: str
    project: str
    location: str
    protect: bool
    services: ProjectServices


class ExportBucket(pulumi.ComponentResource):
    bucket: gcp.storage.Bucket

    def __init__(self, name: str, args: ExportBucketArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:infra:ExportBucket", name, None, opts)
        # Uniform access: IAM alone decides who reads it (no per-object ACLs), and never public. Like Lustre, it holds
        # results: protected with protectData, and never emptied by a destroy.
        self.bucket = gcp.storage.Bucket(
            name,
            name=args.name,
            project=args.project,
            location=args.location,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            force_destroy=False,
            opts=pulumi.ResourceOptions(
                parent=self, protect=args.protect, depends_on=args.services.needed_by("storage")
            ),
        )
        self.register_outputs({"bucket": self.bucket.name})
