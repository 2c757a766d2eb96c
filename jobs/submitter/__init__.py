"""The parts of ray_submit.py, one concern a module; shipped beside it in the launcher ConfigMap (stdlib + Ray only).

- cli: the command line; errors: exit codes and the errors that end a run; output: what is printed, secrets scrubbed.
- ray_api: the Jobs API client, lookups, outages; ray_auth: the Ray token header and what a 401/403 means.
- attempts: the run of one submission id (latest attempt, submit or attach, retries, the outcome).
- log_follower: streaming a job's log while polling its status; head_restart: a lost job told from a deleted one.
- records: step outcome records on Lustre; stop_on_delete: SIGTERM, and stopping the Ray job when the run is deleted.
"""
