"""What governs the stages as the job runs: the offload policy versions in force, the topics set aside after
repeated failures, and the read and upload rate limits. (The ``offload-now`` control requests are
``checkpoints.control_requests``.)"""
