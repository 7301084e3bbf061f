#!/usr/bin/env bash
# Install the system parts of the test lab (real Slurm, munge, OpenMPI, sshd, iproute2, Java for Spark, Graphviz
# for keras.utils.plot_model) with apt-get,
# when running as root and something is missing. `make test` runs this; on a user's own cluster these
# come from the cluster, and hvdkeras itself needs none of them.
#
# Without root or apt-get this prints what is missing and exits 0: the tests that need the lab then skip
# with the reason.
set -euo pipefail

need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
command -v mpirun >/dev/null || need+=(openmpi-bin libopenmpi-dev)
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)  # PySpark's JVM (the spark extra)
command -v dot >/dev/null || need+=(graphviz)  # keras.utils.plot_model in the corpus

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install_lab.sh: not root with apt-get; the lab tests will skip. Missing: ${need[*]}" >&2
  exit 0
fi
echo "install_lab.sh: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The packages' own services are not started here: the tests start munged, slurmctld, slurmd and sshd
# with configurations of their own, and stop them afterwards.
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
