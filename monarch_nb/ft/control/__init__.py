"""Runs in the notebook kernel (the controller's threads): the run's lifecycle (``FTRun``, with
where it lives ``opening``, how it ends ``finish`` and ``stopping``, ``scaling``), the
``supervisor`` that watches groups and brings them back through a ``responses`` class (the
default climbs the recovery ``ladder``: its rungs use only the ``means`` protocol), the
``launcher`` (bring groups up and down, warm ``spares``), the ``detector`` (has a group
failed?), ``total_loss`` (no live peer left), ``placement``, the fault ``injector`` and its
``fault_delivery``, ``identity`` checks, the Lighthouse (``coordinator``, ``lighthouse``) and
the run's ``checkpoint_folder``. Of the worker side it imports only the actor class it spawns
(``worker.trainer_actor``).

Threads and locks: who owns what. No thread holds two of these at once, and none is held
across a call to a worker.
  Scaler._lock                one scale() at a time (scaling.py)
  FinishWatch._finishing      taken once, by the thread that ends a finished run (finish.py)
  GroupTable.lock (RLock)     the group table: each group's state, step, actors, pids, failure, rung
  SparePool._lock             the spares and their states
  Supervisor._acks_lock       per group, the last event sequence the controller holds
  TotalLoss._lock             one total-loss episode at a time (total_loss.py)
  RestartResponse.lock        the claim of a restart of every group (on_failure="restart")
  FaultInjector._lock         the fault log's read position and the firings read from it
  IdentityChecks._lock        pending digest requests and their reports
  ProcessJobPlacement._lock   the ProcessJob the groups' hosts come from (one per run)
Each supervisor thread (``ft-supervise-replicaN``) writes only its own group's poll deadline.
"""
