"""tidelog_rolling_upgrade: roll a group (or the whole cluster) to a target version one node at a
time behind health gates."""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from ops import dagkit, dagtasks

DOC = """
### Rolling upgrade

Moves one broker group to a **target version** without taking it down:

1. **pre_check**: the group must be healthy before anything is touched.
2. **roll**: installs the target on every host first (side by side with the running build), then
   one node at a time — followers first, the leader last after leadership is handed to an
   upgraded, caught-up follower (raft: leadership transfer; master-slave: promotion of an in-sync
   slave) — stop, start on the target, and wait until it is back and caught up before the next.
   With *Workload rate* > 0, acknowledged sends run through the whole roll and the task checks
   that none was lost and reports the longest gap between acknowledgements.
3. **post_check**: the group is healthy on the target.

With *Broker group* empty on a spec with several groups or name servers, the roll covers the
**whole cluster**: the name servers one at a time, each followed by the **route gate** (every
name server lists every group with the leader the group itself reports, so a client always finds
a name server with complete routes), then group by group as above, with the route gate after each.

**A red run means** a gate failed: a node did not come back on the target, did not catch up, or
leadership could not move. The roll **stops with the group serving** (never more than one node
out) and the log says which node and why; with *Roll back on failure* the nodes already upgraded
are returned to their previous build. `tidelog upgrade --spec ... --rollback` does the same later.
"""


@dag(dag_id="tidelog_rolling_upgrade", schedule=None, catchup=False, max_active_runs=1,
     tags=dagkit.TAGS + ["upgrade"], doc_md=DOC, default_args=dagkit.DEFAULT_ARGS,
     params={
         "spec": dagkit.spec_param(),
         "to": Param("current", type="string", minLength=1, title="Target version",
                     description="`current` (this source tree), a version found in the spec's wheels dir "
                                 "(e.g. 0.2.0 for tidelog-0.2.0-*.whl), or a wheel path on the worker."),
         "group": dagkit.group_param("the whole cluster -- its name servers one at a time, then group by group (a one-group spec: that group)"),
         "rollback_on_failure": Param(True, type="boolean", title="Roll back on failure",
                                      description="If a gate fails, return the nodes already upgraded to "
                                                  "their previous build."),
         "workload_rate": Param(0, type="number", minimum=0, maximum=5000, title="Workload rate (sends/s)",
                                description="Acknowledged sends per second through the roll, checked for "
                                            "loss afterwards; 0: no workload."),
     })
def tidelog_rolling_upgrade():
    @task
    def pre_check():
        p = dagkit.params_of()
        return dagkit.run(dagtasks.health_gate, p["spec"], p["group"], None, "before the roll")

    @task
    def roll():
        p = dagkit.params_of()
        return dagkit.run(dagtasks.rolling_upgrade, p["spec"], p["to"], p["group"], p["rollback_on_failure"],
                          float(p["workload_rate"]))

    @task
    def post_check():
        p = dagkit.params_of()
        return dagkit.run(dagtasks.health_gate, p["spec"], p["group"], None, "after the roll")

    pre_check() >> roll() >> post_check()


tidelog_rolling_upgrade()
