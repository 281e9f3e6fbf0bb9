"""Runs inside worker processes: the Monarch actor that is one rank of a replica group
(``TrainerActor``) and the trainer it holds (``ReplicaTrainer``), made of what a rank is built
from (``rank_parts``), its state as heals, checkpoints and digests see it (``rank_state``), how
its group keeps in step with the others (``replication``: ``torchft_replication`` or
plain_restart's ``plain_replication``) and the step (``train_step``); heals (the striped
transport, ``heal_choice``), durable checkpoint writes and fault firing.
Nothing here imports the controller side (``ft.control``): a worker knows only what it is told.

Threads: the actor's endpoints (Monarch's thread) and one training thread share the trainer;
``TrainerActor._lock`` guards the event queue, armed faults and requested digests; the
training thread alone touches the model, optimizer and torchft Manager. In a striped heal the
donor's ``StripedTransport._cond`` guards the state it serves (its serving threads wait on it).
"""
