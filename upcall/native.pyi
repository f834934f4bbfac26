from typing import Any

from typing_extensions import disjoint_base

@disjoint_base
class NativeHandler:
    target: Any
    def __init__(self, target: Any = None) -> None: ...

@disjoint_base
class Count(NativeHandler):
    messages: int
    bytes: int
    def __init__(self) -> None: ...

@disjoint_base
class FieldFilter(NativeHandler):
    key: str
    seen: int
    matched: int
    missing: int
    errors: int
    def __init__(self, key: str, *, target: Any = None, eq: Any = ..., ne: Any = ...,
                 gt: float = ..., ge: float = ..., lt: float = ..., le: float = ...) -> None: ...
