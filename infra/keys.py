"""Config key names and values that the settings and the day-2 guard both know (a bottom module: imports nothing of
infra, so neither imports the other for them)."""

ALLOW_REPLACE_KEY = "allowReplace"
# exportBucket's value that makes the stack create the bucket (PROJECT-CLUSTER-models).
EXPORT_BUCKET_CREATE = "create"
# Keys whose value the program derives from another key unless the user sets them: when both change, the derived
# one is reported as a consequence of the key the user changed (allowing that key allows both).
DERIVED_FROM = {"rayAutoscaling": "gpuProvisioning", "rayVersion": "nemoRlImage", "rayWorkerReplicas": "gpuNodes"}
