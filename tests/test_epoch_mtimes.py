"""containers/substrate/epoch-mtimes.sh in a real container of the local engine (issue 26 item 3): a RUN step's
layer holds the same entries with the same mtimes however long the engine took to start the step's container."""

from __future__ import annotations

from pathlib import Path

import dockerd

docker_client, test_base = dockerd.docker_client, dockerd.test_base  # session fixtures (tests/dockerd.py)

SCRIPT = Path(__file__).resolve().parent.parent / "containers" / "substrate" / "epoch-mtimes.sh"
EPOCH = 1783237347


def _step(client, image: str, start_delay_s: int) -> tuple[list, str]:
    """A RUN step as the recipes write it (begin, work, end) in a container whose step starts `start_delay_s` after
    the engine made it: (the container's changes, the mtime of /etc/mtab and /opt/x it ends with)."""
    script = SCRIPT.read_text().replace("'", "'\\''")
    cmd = (
        f"printf '%s' '{script}' > /dev/shm/em.sh && sleep {start_delay_s} && sh /dev/shm/em.sh begin "
        "&& mkdir -p /opt/x && sh /dev/shm/em.sh end && stat -c %Y /etc/mtab /opt/x"
    )
    c = client.containers.create(
        image, ["sh", "-c", cmd], environment={"SOURCE_DATE_EPOCH": str(EPOCH)}, network_mode="none"
    )
    try:
        c.start()
        assert c.wait(timeout=60)["StatusCode"] == 0, c.logs().decode()
        return sorted((d["Path"], d["Kind"]) for d in c.diff()), c.logs().decode().split()
    finally:
        c.remove(force=True)


def test_a_slow_container_start_gives_the_same_layer_entries_and_mtimes(docker_client, test_base):
    """The engine makes /etc/mtab (and /.dockerenv) when it creates the container. The old mark (two seconds before
    `begin`) left them out of the layer when the step started later than that (a loaded machine), in when it started
    at once: two builds' layers differed by /etc and /etc/mtab (the substrate's pip layer, results/images/
    substrate-twice.json). The mark now predates the container: the same changes, every path at the epoch."""
    fast, fast_times = _step(docker_client, test_base, 0)
    slow, slow_times = _step(docker_client, test_base, 3)
    assert fast == slow, (fast, slow)
    assert ("/etc/mtab", 0) in slow or ("/etc/mtab", 1) in slow  # touched, so copied up into the layer: every build
    assert fast_times == slow_times == [str(EPOCH), str(EPOCH)]
