"""One child per GGUF file and child options (ModelPlan.child): a copy of a loaded model reuses its child."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.test_scheduler import FakeLauncher, plan

from llmman.sched.scheduler import ModelPlan, Scheduler


def on_file(name: str, path: str = "/store/blobs/sha256/aa", n_ctx: int = 2048,
            **changes: object) -> ModelPlan:
    return replace(plan(name, n_ctx=n_ctx), model_path=path, **changes)  # type: ignore[arg-type]


@pytest.fixture
def launcher() -> FakeLauncher:
    return FakeLauncher()


async def test_a_copy_reuses_the_loaded_child_and_ps_shows_the_first_name(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    a = await sched.acquire(on_file("docker.io/ai/a:1"))
    b = await sched.acquire(on_file("docker.io/ai/b:1"))
    assert len(launcher.started) == 1 and a.base_url == b.base_url
    (snap,) = sched.snapshot()
    assert (snap.reference, snap.refcount) == ("docker.io/ai/a:1", 2)
    assert sched.is_loaded("docker.io/ai/b:1")
    a.release()
    b.release()
    assert await sched.unload("docker.io/ai/b:1")  # either name unloads the shared child
    assert launcher.started[0].stopped.is_set() and sched.snapshot() == []
    await sched.close()


@pytest.mark.parametrize(
    "changes",
    [{"path": "/store/blobs/sha256/bb"}, {"n_parallel": 2}, {"extra_args": ("--temp", "0")},
     {"embedding": True}, {"n_gpu_layers": 0}, {"devices": "1"}, {"path": ""}],
)  # fmt: skip
async def test_another_file_or_other_child_options_get_their_own_child(launcher: FakeLauncher,
                                                                       changes: dict[str, object]) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    (await sched.acquire(on_file("docker.io/ai/a:1"))).release()
    (await sched.acquire(on_file("docker.io/ai/b:1", **changes))).release()
    assert len(launcher.started) == 2 and len(sched.snapshot()) == 2
    await sched.close()


async def test_a_copy_asking_a_bigger_context_reloads_under_its_own_name(launcher: FakeLauncher) -> None:
    sched = Scheduler(launcher, default_keep_alive=300)
    (await sched.acquire(on_file("docker.io/ai/a:1", n_ctx=1024))).release()
    (await sched.acquire(on_file("docker.io/ai/b:1", n_ctx=512))).release()  # smaller: reused
    assert len(launcher.started) == 1
    (await sched.acquire(on_file("docker.io/ai/b:1", n_ctx=4096))).release()
    assert len(launcher.started) == 2 and launcher.started[0].stopped.is_set()
    (snap,) = sched.snapshot()
    assert (snap.reference, snap.n_ctx) == ("docker.io/ai/b:1", 4096)
    await sched.close()
