"""Runs inside worker processes: the Monarch actor that is one rank of a replica group
(``TrainerActor``), the torchtitan/torchft trainer it builds (``ReplicaTrainer``), heals (the
striped transport), durable checkpoint writes, fault firing and plain_restart's replication.
Nothing here imports the controller side (``ft.control``): a worker knows only what it is told.

Threads: the actor's endpoints (Monarch's thread) and one training thread share the trainer;
``TrainerActor._lock`` guards the event queue, armed faults and requested digests; the
training thread alone touches the model, optimizer and torchft Manager. In a striped heal the
donor's ``StripedTransport._cond`` guards the state it serves (its serving threads wait on it).
"""
