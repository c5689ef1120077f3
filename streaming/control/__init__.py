"""The control plane the stages share with the job: the offload policy versions in force
(``policy_versions``), the topics set aside after repeated failures (``quarantine``) and the read and upload
rate limits (``rate_limits``, over the pure ``token_bucket``)."""
