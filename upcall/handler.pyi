from typing import Any, final

from typing_extensions import disjoint_base

@disjoint_base
class Handler:
    batches: bool
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    def on_message(self, msg: Any) -> Any: ...
    def on_topic_message(self, topic: bytes, msg: Any) -> Any: ...
    def on_batch(self, msgs: list[Any]) -> Any: ...
    def __call__(self, msg: Any) -> Any: ...

@final
class Counter(Handler):
    count: int
    last: Any
    def __init__(self, batches: bool = False) -> None: ...

def _call_loop(target: Any, n: int, msg: Any = None) -> int:
    """For the benchmark (private): target(msg) n times from a C loop."""
