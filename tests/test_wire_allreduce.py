"""labkit.costmodel.allreduce_times, naive against ring timed on every rank: under a real mpiexec on this machine, and
through labkit.network's costly_network, across namespace hosts whose cables are shaped to 100 Mbit/s, where a
megabyte's allreduce must take what the alpha-beta model says the cable needs for it."""

from __future__ import annotations

import json

import pytest
from conftest import ranks

from labkit import cluster, costmodel, network
from labkit.cluster import hosts
from labkit.costmodel import AlphaBeta

SHAPING, WHY = hosts.shaping_available()

TIMES = """
import json, sys
from mpi4py import MPI
from labkit import costmodel
comm = MPI.COMM_WORLD
got = costmodel.allreduce_times(comm, [1, 1000, 50_000], algorithms=("naive", "ring", "mpi"), repeat=2)
assert comm.allgather(got) == [got] * comm.Get_size(), "allreduce_times differs between ranks"
try:
    costmodel.allreduce_times(comm, [10], algorithms=("ring", "magic"))
    refused = ""
except ValueError as e:  # on every rank, before any message: the job goes on
    refused = str(e)
if comm.Get_rank() == 0:
    print("TIMES", json.dumps({"got": got, "refused": refused}), flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", ranks(1, 2, 3))
def test_allreduce_times_under_mpiexec(n, tmp_path):
    script = tmp_path / "times.py"
    script.write_text(TIMES)
    res = cluster.run_mpi([str(script)], n=n, timeout=120)
    assert res.returncode == 0 and "TIMES " in res.stdout, res.stderr[-3000:]
    said = json.loads(res.stdout.split("TIMES ", 1)[1].splitlines()[0])
    got = said["got"]
    assert list(got) == ["sizes", "nbytes", "naive", "ring", "mpi"]
    assert got["sizes"] == [1, 1000, 50_000] and got["nbytes"] == [4, 4000, 200_000]  # float32
    for name in ("naive", "ring", "mpi"):
        assert len(got[name]) == 3 and all(isinstance(t, float) and 0 <= t < 5 for t in got[name]), got
    assert "no allreduce named 'magic'" in said["refused"] and "ring" in said["refused"]


@pytest.mark.mpi
def test_on_this_machine_when_shaped_hosts_are_turned_off(monkeypatch):
    monkeypatch.setenv("LABKIT_SHAPED_HOSTS", "0")
    with network.costly_network(hosts=4, link="100mbit") as wire:
        assert not wire.shaped and wire.hosts is None and wire.bits_per_second is None
        assert "this machine" in wire.setting and "LABKIT_SHAPED_HOSTS=0" in wire.setting
        one_way = wire.run("labkit.costmodel:pingpong", ranks=2, sizes=[8, 100_000], repeat=3, warmup=1)
        got = wire.run("labkit.costmodel:allreduce_times", ranks=3, sizes=[1000], repeat=1)
    assert len(one_way) == 2 and all(t > 0 for t in one_way)  # rank 0 is the ping-pong's rank a: its times
    costmodel.fit([8, 100_000], one_way)
    assert got["nbytes"] == [4000] and len(got["naive"]) == len(got["ring"]) == 1


@pytest.mark.mpi
@pytest.mark.hosts
@pytest.mark.quiet  # a cable's measured rate against the model: beside the other tests' load it read 0.101 s for 0.08
@pytest.mark.skipif(not SHAPING, reason=WHY or "shaped cables cannot be made here")
def test_a_megabytes_allreduce_across_a_100mbit_cable_takes_the_models_time():
    nbytes = 1_000_000
    with network.costly_network(hosts=2, link="100mbit") as wire:
        if not wire.shaped:  # root with ip and tc, but no namespaces (a container)
            pytest.skip(wire.setting)
        got = wire.run("labkit.costmodel:allreduce_times", ranks=2, sizes=[nbytes // 4], repeat=3)
    cable = AlphaBeta(alpha=0.0, beta=8 / wire.bits_per_second)  # the cable's rate; no start-up worth counting
    # on 2 ranks both algorithms send N bytes each way through each cable: (p - 1) N beta = 2 (p - 1) N / p beta
    expected = costmodel.predict("naive", cable, 2, nbytes)[0]
    assert expected == pytest.approx(nbytes * 8 / 1e8)
    assert got["nbytes"] == [nbytes]
    assert got["naive"][0] == pytest.approx(expected, rel=0.25), got
    assert got["ring"][0] == pytest.approx(costmodel.predict("ring", cable, 2, nbytes)[0], rel=0.25), got
