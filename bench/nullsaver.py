"""A checkpointer that stores nothing: LangGraph's own checkpointing cost.

With ``NullSaver`` a graph still builds every checkpoint, computes new
versions and calls ``put``/``put_writes`` on its background executor; only
the storing is free. The gap between it and a real saver is what the saver
costs on LangGraph's hot path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

__all__ = ["NullSaver"]


class NullSaver(BaseCheckpointSaver[int]):
    """``put`` returns the new config, everything else forgets or finds nothing."""

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        return iter(())

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        conf = config["configurable"]
        return {"configurable": {"thread_id": conf["thread_id"],
                                 "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                 "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        return None

    def delete_thread(self, thread_id: str) -> None:
        return None

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return None

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        return
        yield

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        return None

    async def adelete_thread(self, thread_id: str) -> None:
        return None
