"""Types of the compiled ARC (`_arc_core.pyx`) for mypy: the pure-Python ARC's interface
(at run time it subclasses `CachePolicy`, not `PureARCCachePolicy`)."""

from kvtier.policies.arc import PureARCCachePolicy

class ARCCachePolicy(PureARCCachePolicy): ...
