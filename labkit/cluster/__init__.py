"""Where MPI runs: jobs launched with this environment's ``mpiexec`` (:mod:`.launch`), ipyparallel's MPI engines for
the notebooks (:mod:`.engines`), several hosts made of network namespaces (:mod:`.hosts`), a SLURM cluster
(:mod:`.slurm`), and the processes they start, found and ended (:mod:`.processes`).

The notebooks and the lessons' code use the names below as ``labkit.cluster.NAME``.
"""

from __future__ import annotations

from .engines import ClusterError, MPICluster, first_ranks, running_clusters
from .launch import LOOPBACK_ONLY, address_toward, hosts_args, loopback_preload, mpi_env, mpiexec_path, run_mpi

__all__ = ["LOOPBACK_ONLY", "ClusterError", "MPICluster", "address_toward", "first_ranks", "hosts_args",
           "loopback_preload", "mpi_env", "mpiexec_path", "run_mpi", "running_clusters"]
