"""One small registry type, used only for leaves (objectives, aggregations, advantage estimators,
reward functions, tasks). Unknown names fail with the list of valid ones (docs/architecture.md)."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised for a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a readable sentence.
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> T:
        return self.register(name)(obj)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid choices: {', '.join(sorted(self._items))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
