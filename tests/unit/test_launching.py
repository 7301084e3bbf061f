"""Reading launchers' environments (recorded from real srun, sbatch, mpirun runs here) into one job."""

import pytest

from hvdkeras import launching
from hvdkeras.launching import LaunchEnvError, detect

# Recorded from `srun -n 2` task 1 on this host's Slurm 22.05 (the variables hvdkeras reads, and neighbours).
SRUN_TASK1 = {
    "SLURM_CLUSTER_NAME": "hvdkeraslab", "SLURM_JOBID": "1", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "vm",
    "SLURM_JOB_NUM_NODES": "1", "SLURM_LOCALID": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
    "SLURM_NODELIST": "vm", "SLURM_NPROCS": "2", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "vm", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_SRUN_COMM_HOST": "127.0.0.1",
}
# Recorded in an `sbatch -n 2` batch script itself (one process, before any srun).
SBATCH_SCRIPT = {
    "SLURM_JOB_ID": "2", "SLURM_JOB_NODELIST": "vm", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
    "SLURM_NODELIST": "vm", "SLURM_NPROCS": "2", "SLURM_NTASKS": "2", "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "2",
}
# Recorded from `mpirun -np 2` (OpenMPI 4.1.4) rank 0.
MPIRUN_RANK0 = {
    "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "0",
    "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_ess_base_jobid": "2055340033",
    "OMPI_UNIVERSE_SIZE": "2", "PMIX_NAMESPACE": "2055340033", "PMIX_RANK": "0",
}


def test_srun_task_on_one_node_stays_on_loopback():
    env = detect(SRUN_TASK1)
    assert (env.launcher, env.rank, env.size, env.local_rank, env.local_size) == ("Slurm", 1, 2, 1, 2)
    assert env.rendezvous_addr == "127.0.0.1" and env.job_id == "slurm-1.0"
    assert env.rendezvous_port == launching.derived_port("slurm-1.0")
    assert "SLURM_NTASKS=2" in env.variables and "SLURM_PROCID=1" in env.variables


def test_srun_on_several_nodes_meets_at_the_first_node():
    env = detect({**SRUN_TASK1, "SLURM_STEP_NODELIST": "gpu[07-08],cpu1", "SLURM_NODEID": "1",
                  "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_STEP_NUM_TASKS": "5", "SLURM_PROCID": "3"})
    assert env.rendezvous_addr == "gpu07" and env.addr_source == "SLURM_STEP_NODELIST"
    assert (env.size, env.local_size) == (5, 2)


def test_sbatch_script_itself_is_not_a_job_of_two():
    assert detect(SBATCH_SCRIPT) is None


def test_mpirun_rank_on_one_host():
    env = detect(MPIRUN_RANK0)
    assert (env.launcher, env.rank, env.size, env.local_size, env.mpi) == ("OpenMPI", 0, 2, 2, True)
    assert env.rendezvous_addr == "127.0.0.1" and env.job_id == "ompi-2055340033"


def test_mpirun_across_hosts_needs_master_addr():
    several = {**MPIRUN_RANK0, "OMPI_COMM_WORLD_SIZE": "4"}
    with pytest.raises(LaunchEnvError, match="started 4 processes, 2 on this host, and does not say where rank 0 "
                                             "runs.*Set MASTER_ADDR"):
        detect(several)
    assert detect({**several, "MASTER_ADDR": "node1"}).rendezvous_addr == "node1"


def test_mpich_and_intel_mpi():
    env = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
                  "PMI_KVSNAME": "kvs_77_0"})
    assert (env.launcher, env.rank, env.size, env.local_rank) == ("MPICH/Intel MPI", 1, 2, 1)
    assert env.job_id == "pmi-kvs_77_0"


def test_torchrun_and_kubernetes_convention():
    env = detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                  "MASTER_ADDR": "job-0.job", "MASTER_PORT": "29500"})
    assert (env.rank, env.size, env.rendezvous_addr, env.rendezvous_port) == (3, 4, "job-0.job", 29500)
    assert env.addr_source == "MASTER_ADDR"
    assert env.job_id == "torchrun/Kubernetes:job-0.job:29500"  # the same on every rank without an id


def test_horovodrun_wins_over_every_launcher():
    assert detect({**SRUN_TASK1, **MPIRUN_RANK0, "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}) is None
    assert detect({**SRUN_TASK1, "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"}) is None


def test_inner_launcher_wins():
    # mpirun inside an sbatch allocation sees the allocation's SLURM_* too.
    assert detect({**SRUN_TASK1, **MPIRUN_RANK0}).launcher == "OpenMPI"
    assert detect({**SRUN_TASK1, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n0", "MASTER_PORT": "1"}).launcher == \
        "torchrun/Kubernetes"


def test_overrides_and_opt_out():
    env = detect({**SRUN_TASK1, "HVDKERAS_RENDEZVOUS_ADDR": "10.1.1.1", "HVDKERAS_RENDEZVOUS_PORT": "4000",
                  "HVDKERAS_JOB_ID": "exp-7"})
    assert (env.rendezvous_addr, env.rendezvous_port, env.job_id) == ("10.1.1.1", 4000, "exp-7")
    assert detect({**SRUN_TASK1, "HVDKERAS_LAUNCHER": "none"}) is None


def test_single_process_launch_is_nothing_to_form():
    assert detect({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert detect({}) is None


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "RANK must be an integer >= 0. Received: RANK='x'"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "Received: RANK=2, WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "without saying how many run on this host"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE must be an integer >= 1. Received: WORLD_SIZE='0'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "a"}, "no MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "70000"}, "MASTER_PORT must be a TCP port"),
    ({**SRUN_TASK1, "SLURM_STEP_NODELIST": "n[1-"}, "unbalanced brackets"),
])
def test_bad_launcher_variables_raise_naming_them(environ, message):
    with pytest.raises(LaunchEnvError) as err:
        detect(environ)
    assert message in str(err.value)


@pytest.mark.parametrize("hostlist, expected", [
    ("vm", ["vm"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a,b[1-2]", ["a", "b1", "b2"]),
    ("r[1-2]-n[8-9]", ["r1-n8", "r1-n9", "r2-n8", "r2-n9"]),
])
def test_expand_hostlist(hostlist, expected):
    assert launching.expand_hostlist(hostlist) == expected


def test_expand_tasks_per_node():
    assert launching.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(LaunchEnvError, match="Received: 'two'"):
        launching.expand_tasks_per_node("two")


def test_derived_port_is_stable_and_in_range():
    port = launching.derived_port("slurm-1.0")
    assert port == launching.derived_port("slurm-1.0") != launching.derived_port("slurm-1.1")
    assert launching.PORT_BASE <= port < launching.PORT_BASE + launching.PORT_SPAN


def test_init_raises_when_the_launcher_says_2_and_horovod_has_1(hvd, monkeypatch):
    """Horovod here is already a job of size 1 (the session fixture): a launcher saying 2 must not be ignored."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError) as err:
        hvd.init()
    message = str(err.value)
    assert "torchrun/Kubernetes started 2 processes" in message and "WORLD_SIZE=2" in message
    assert "formed a job of size 1" in message and "HVDKERAS_LAUNCHER=none" in message
    monkeypatch.setenv("HVDKERAS_LAUNCHER", "none")
    hvd.init()  # on purpose: no error
