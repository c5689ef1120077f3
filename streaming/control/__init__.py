"""The control plane the stages share with the job: the offload policy versions in force, and the topics
set aside after repeated failures."""
