"""``verify`` for offloaded data: the checker behind ``streamoffload verify``.

``verify_segment`` checks one segment's objects (and its manifest); ``verify_topic`` checks a
topic-partition's history and every Offloaded segment of it. Both collect ``Problem``s in a report rather
than raising; the command prints them and sets the exit status.
"""

from streamoffload.read.verify.history import STALE_MINUTES, TopicReport, VerifyProgress, verify_topic
from streamoffload.read.verify.segment import Problem, SegmentReport, VerifyError, verify_segment

__all__ = [
    "STALE_MINUTES",
    "Problem",
    "SegmentReport",
    "TopicReport",
    "VerifyError",
    "VerifyProgress",
    "verify_segment",
    "verify_topic",
]
