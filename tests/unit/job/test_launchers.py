"""Reading launchers' environments (recorded from real srun, sbatch, mpirun runs here) into one job."""

import pytest

from hvdkeras.job import launchers as launching
from hvdkeras.job.launchers import LaunchEnvError, detect
from hvdkeras.job.launchers import env as launchers_env

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


# TF_CONFIG as the platforms write it: Kubeflow's TFJob (training-operator: a chief and workers, service
# names, port 2222, "environment": "cloud"), a TFJob of workers only, and Ray Train's TensorflowTrainer
# (ray/train/tensorflow/config.py: every worker's "ip:free port", task type "worker").
def tf_config(cluster: dict, kind: str, index: int, **extra) -> dict:
    import json

    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}, **extra})}


TFJOB = {"chief": ["mnist-chief-0.kubeflow.svc:2222"],
         "worker": ["mnist-worker-0.kubeflow.svc:2222", "mnist-worker-1.kubeflow.svc:2222"]}
RAY = {"worker": ["10.0.0.5:41231", "10.0.0.6:39875", "10.0.0.5:44021"]}


@pytest.mark.parametrize("kind, index, rank", [("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2)])
def test_tf_config_tfjob_chief_then_workers(kind, index, rank):
    env = detect(tf_config(TFJOB, kind, index, environment="cloud"))
    assert (env.launcher, env.rank, env.size) == ("TF_CONFIG", rank, 3)
    assert (env.rendezvous_addr, env.addr_source) == ("mnist-chief-0.kubeflow.svc", "TF_CONFIG")
    assert (env.local_rank, env.local_size) == (0, 1)  # one task per pod
    assert env.variables[0].startswith("TF_CONFIG=")


def test_tf_config_workers_only_and_ray_train():
    env = detect(tf_config({"worker": ["w0:2222", "w1:2222"]}, "worker", 1))
    assert (env.rank, env.size, env.rendezvous_addr) == (1, 2, "w0")
    ranks = [detect(tf_config(RAY, "worker", i)) for i in range(3)]
    assert [(e.rank, e.local_rank, e.local_size) for e in ranks] == [(0, 0, 2), (1, 0, 1), (2, 1, 2)]
    assert {e.rendezvous_addr for e in ranks} == {"10.0.0.5"}
    # Every process derives the same port and job id from the cluster, and the port is none of the cluster's.
    assert len({(e.rendezvous_port, e.job_id) for e in ranks}) == 1
    assert ranks[0].rendezvous_port not in (41231, 39875, 44021, 2222)


def test_tf_config_port_skips_the_cluster_ports():
    cluster = {"worker": ["a:1", "b:1"]}
    env = detect(tf_config(cluster, "worker", 0))
    derived = launching.derived_port(env.job_id)
    assert env.rendezvous_port == derived
    # An evaluator's server port counts as taken too: the derived port moves on to the next one.
    taken = detect(tf_config({**cluster, "evaluator": [f"e:{derived}"]}, "worker", 0))
    assert taken.job_id == env.job_id and taken.rendezvous_port == derived + 1
    port = launching.derived_port("job")
    assert launchers_env._port({}, None, "job", "X", avoid={port}) == port + 1
    with_port = detect({**tf_config(cluster, "worker", 1), "MASTER_PORT": "29400"})
    assert with_port.rendezvous_port == 29400


def test_tf_config_single_task_is_nothing_to_form():
    assert detect(tf_config({"worker": ["localhost:12345"]}, "worker", 0)) is None


@pytest.mark.parametrize("environ, message", [
    ({"TF_CONFIG": "{not json"}, "TF_CONFIG must be JSON with a 'cluster' and a 'task'. Received: TF_CONFIG='{not"),
    ({"TF_CONFIG": "[1]"}, "TF_CONFIG must be a JSON object with a 'cluster' and a 'task'"),
    (tf_config({**TFJOB, "evaluator": ["e:2222"]}, "evaluator", 0),
     "TF_CONFIG's task 'evaluator' does not train"),
    (tf_config({**TFJOB, "ps": ["p:2222"]}, "worker", 0), "parameter-server job (its cluster has 'ps' tasks)"),
    (tf_config({**TFJOB, "ps": ["p:2222"]}, "ps", 0), "Received: task ps:0"),
    (tf_config(TFJOB, "worker", 2), "task index must be in [0, 2), the number of 'worker' tasks"),
    (tf_config(TFJOB, "chief", 1), "Received: task chief:1"),
    (tf_config({"worker": "w0:1"}, "worker", 0), "cluster['worker'] must be a list of 'host:port' strings"),
])
def test_bad_tf_config_raises_naming_the_variable_and_the_task(environ, message):
    with pytest.raises(LaunchEnvError) as err:
        detect(environ)
    assert message in str(err.value)


def test_tf_config_precedence():
    """horovodrun, MPI and torchrun's variables come before TF_CONFIG; TF_CONFIG before Slurm's."""
    job = tf_config(TFJOB, "worker", 0)
    assert detect({**job, "HOROVOD_RANK": "0", "HOROVOD_SIZE": "3"}) is None
    assert detect({**job, **MPIRUN_RANK0}).launcher == "OpenMPI"
    assert detect({**job, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n0", "MASTER_PORT": "1"}).launcher == \
        "torchrun/Kubernetes"
    assert detect({**job, **SRUN_TASK1}).launcher == "TF_CONFIG"
    assert detect({**job, "HVDKERAS_LAUNCHER": "none"}) is None


# Recorded from a real `torchrun --nproc-per-node 2` (torch 2.13.0) worker, rank 1.
TORCHRUN_RANK1 = {
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "localhost",
    "MASTER_PORT": "42095", "RANK": "1", "ROLE_NAME": "default", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2",
    "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "117edc0e-5d7d-4a41-928c-e9647f3e4415", "TORCHELASTIC_USE_AGENT_STORE": "True",
    "WORLD_SIZE": "2",
}


def test_real_torchrun_leaves_master_port_to_its_agent_store():
    env = detect(TORCHRUN_RANK1)
    assert (env.launcher, env.rank, env.size, env.local_rank, env.local_size) == ("torchrun/Kubernetes", 1, 2, 1, 2)
    assert env.rendezvous_addr == "localhost"
    assert env.rendezvous_port != 42095  # the agent's TCPStore listens there
    assert env.job_id == "torch-117edc0e-5d7d-4a41-928c-e9647f3e4415@localhost:42095"
    assert env.rendezvous_port == launching.derived_port(env.job_id)
    assert env.rendezvous_port == detect({**TORCHRUN_RANK1, "RANK": "0", "LOCAL_RANK": "0"}).rendezvous_port
    # Two torchrun jobs without --rdzv-id both say "none": their stores' ports tell them apart.
    none = {**TORCHRUN_RANK1, "TORCHELASTIC_RUN_ID": "none"}
    assert detect(none).job_id != detect({**none, "MASTER_PORT": "42096"}).job_id
    assert detect({**TORCHRUN_RANK1, "HVDKERAS_RENDEZVOUS_PORT": "4000"}).rendezvous_port == 4000
    # Without torchrun's agent (Kubernetes, hvdkeras run --nnodes) MASTER_PORT is the rendezvous port.
    plain = {k: v for k, v in TORCHRUN_RANK1.items() if not k.startswith("TORCHELASTIC")}
    assert detect(plain).rendezvous_port == 42095
