from typing import Any

class NativeHandler:
    target: Any
    def __init__(self, target: Any = None) -> None: ...

class Count(NativeHandler):
    messages: int
    bytes: int
    def __init__(self) -> None: ...

class FieldFilter(NativeHandler):
    key: str
    seen: int
    matched: int
    missing: int
    errors: int
    def __init__(self, key: str, *, target: Any = None, eq: Any = ..., ne: Any = ...,
                 gt: float = ..., ge: float = ..., lt: float = ..., le: float = ...) -> None: ...
