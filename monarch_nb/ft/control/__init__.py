"""Runs in the notebook kernel (the controller's threads): the run's lifecycle (``FTRun``), the
supervisor that brings groups up, watches and recovers them, warm spares, placement, the fault
injector, identity checks, the Lighthouse's process and the run's checkpoint folder. Of the
worker side it imports only the actor class it spawns (``worker.trainer_actor``).

Threads and locks: who owns what. No thread holds two of these at once, and none is held
across a call to a worker.
  FTRun._scaling              one scale() at a time
  FTRun._finishing            taken once, by the thread that ends a finished run
  GroupTable.lock (RLock)     the group table: each group's state, step, actors, pids, failure
  SparePool._lock             the spares and their states
  Supervisor._acks_lock       per group, the last event sequence the controller holds
  Supervisor._lost_lock       one total-loss episode at a time
  CheckpointRestart.lock      the claim of a restart of every group (recovery="restart")
  FaultInjector._lock         the fault log's read position and the firings read from it
  IdentityChecks._lock        pending digest requests and their reports
  ProcessJobPlacement._lock   the ProcessJob the groups' hosts come from (one per run)
Each supervisor thread (``ft-supervise-replicaN``) writes only its own group's poll deadline.
"""
