"""tidelog_failover_drill: the scheduled failover drill (daily by default)."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import Param, dag, task

from ops import dagkit, dagtasks

DOC = """
### Failover drill

Runs acknowledged sends at a steady rate against one broker group while a **nemesis** injects
faults (kill -9 / pause / partition / isolate, of the leader or a random node, or a combined
sequence of them in one fault window, each step in the report's fault timeline), heals them, waits
for the group to be healthy again, drains every message and checks the history, Jepsen-style:

- no acknowledged send lost, none at another offset than acknowledged, none reordered,
  none duplicated beyond what the client's retries explain, none read that was refused;
- the replicas' logs agree byte for byte on the committed prefix (collected and compared).

On a spec with **name servers** the sends go through them to every group holding the drill's
topic, *Broker group* picks the group the broker faults hit, and two nemeses hit the name
servers: *kill-namesrv* (every name server down for the fault window: sends to known routes must
go on) and *kill-namesrv-and-leader* (then the group's leader too: clients must find the new
leader from the member addresses they already know).

The report — `report.json` (figures, anomalies, faults, leader timeline, the seed to replay it)
and `drill.png` (acks per second, latency, faults, leader changes) — is stored per run under
*Reports directory*/`<run id>`/; the task log prints both paths.

**A red run means**: *pre_check* — the group was not healthy, so no drill ran; *drill* — a
**safety violation** (the log lists each anomaly with an example and the report path), or the
group did not recover. Replay the same fault schedule with `tidelog drill --seed N`.
Scheduled daily at 01:00 UTC (`TIDELOG_DRILL_SCHEDULE` changes it).
"""


@dag(dag_id="tidelog_failover_drill", schedule=dagkit.schedule("TIDELOG_DRILL_SCHEDULE", "0 1 * * *"),
     catchup=False, max_active_runs=1, tags=dagkit.TAGS + ["drill"], doc_md=DOC,
     default_args=dagkit.DEFAULT_ARGS,
     params={
         "spec": dagkit.spec_param(),
         "group": dagkit.group_param("the first group (with name servers, the sends still go to every group)"),
         "nemesis": Param("kill-leader", type="string", enum=dagkit.NEMESES, title="Nemesis",
                          description="The fault: kill -9, SIGSTOP, partition or isolate the leader or a random "
                                      "node; mixed: a random one each time, sometimes two overlapping. "
                                      "Combined sequences: isolated-restart (pause the slaves/followers, kill -9 "
                                      "the leader, fail over, restart the old leader in isolation, heal), "
                                      "partition-then-kill (partition the leader, then kill -9 the new one), "
                                      "kill-during-transfer (kill -9 the leader or target mid leadership transfer). "
                                      "With name servers: kill-namesrv (kill -9 every name server for the "
                                      "window), kill-namesrv-and-leader (then the group's leader)."),
         "duration_s": Param(60, type="number", minimum=5, maximum=3600, title="Duration (s)",
                             description="Seconds of workload; faults come and go inside it."),
         "rate": Param(200, type="number", minimum=1, maximum=5000, title="Rate (sends/s)",
                       description="Acknowledged sends per second (open loop)."),
         "seed": Param(None, type=["null", "integer"], title="Seed",
                       description="Replay an earlier drill's fault choices; empty: a new random seed "
                                   "(printed and stored in the report)."),
         "workload": Param("native", type="string", enum=["native", "kafka"], title="Workload client",
                           description="native: the Python client; kafka: librdkafka (acks=all, idempotence) "
                                       "through the group's Kafka listeners (a spec without name servers). "
                                       "The same history checker either way."),
         "reports_dir": Param(dagkit.home_dir("TIDELOG_DRILL_REPORTS", "drill-reports"), type="string",
                              title="Reports directory",
                              description="Each run's report goes to <this>/<run id>/<drill id>/."),
     })
def tidelog_failover_drill():
    @task
    def pre_check():
        p = dagkit.params_of()
        return dagkit.run(dagtasks.health_gate, p["spec"], p["group"], None, "before the drill")

    @task
    def drill():
        p = dagkit.params_of()
        out = Path(p["reports_dir"]).expanduser() / dagkit.run_dir_name()
        dagkit.announce("report_dir", str(out))   # the run's "Tidelog report" tab finds it here, red or green
        return dagkit.run(dagtasks.drill, p["spec"], p["nemesis"], p["duration_s"], p["rate"], out,
                          p["group"], p["seed"], workload=p.get("workload", "native"))

    pre_check() >> drill()


tidelog_failover_drill()
