"""Forming and running the job: `launchers` (reading a launcher's environment, one module per convention),
`rendezvous` (rank 0 hosts it; every worker joins), `auth` (the job's secret and the signatures of rendezvous
requests), `threads` (the priority of Horovod's threads) and
`lifecycle` (start, restart and stop Horovod, pin the GPU). Nothing here knows about Keras training."""
