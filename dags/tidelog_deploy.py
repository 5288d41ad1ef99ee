"""tidelog_deploy: (optionally) provision a spec's hosts, deploy it at a version, gate on health."""

from __future__ import annotations

from airflow.sdk import Param, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from ops import dagkit, dagtasks

DOC = """
### Deploy a Tidelog cluster

Gets the broker groups of a **cluster spec** running on its hosts:

1. **provision** (only with *Provision hosts* ticked): the spec's provider makes the hosts
   (`local`: loopback addresses; `netns`: namespaces with sshd; `static`: checks the VMs answer).
2. **deploy**: builds or finds the wanted version, installs it side by side on every host that
   lacks it (SFTP for remote hosts, no PyPI needed there), writes each node's config and starts
   the nodes that are not running. Deploying again changes nothing on a healthy cluster.
3. **health_gate**: waits (the spec's `health.timeout_s`, or the form's value) until every group
   has a leader and every follower is connected and caught up.

**A red run means**: *deploy* — the build, an install or a start failed (the log names the host),
or a running node is on another build/config and was left alone (roll it with
`tidelog_rolling_upgrade`); *health_gate* — the cluster came up but is degraded or down; the log
shows each node's state, role and version.
"""


@dag(dag_id="tidelog_deploy", schedule=None, catchup=False, max_active_runs=1, tags=dagkit.TAGS + ["deploy"],
     doc_md=DOC, default_args=dagkit.DEFAULT_ARGS,
     params={
         "spec": dagkit.spec_param(),
         "version": Param(None, type=["null", "string"], title="Version",
                          description="What to run: empty for the spec's `version`; `current` (this source "
                                      "tree), a version found in the spec's wheels dir, or a wheel path."),
         "provision": Param(False, type="boolean", title="Provision hosts",
                            description="Make the spec's hosts first (`tidelog infra up`)."),
         "health_timeout_s": Param(None, type=["null", "number"], minimum=1, title="Health timeout (s)",
                                   description="How long the health gate waits; empty: the spec's health.timeout_s."),
     })
def tidelog_deploy():
    @task
    def provision():
        p = dagkit.params_of()
        if not p["provision"]:
            raise AirflowSkipException("provision not asked for: the hosts are taken as they are")
        return dagkit.run(dagtasks.provision, p["spec"])

    @task(trigger_rule="none_failed")
    def deploy():
        p = dagkit.params_of()
        return dagkit.run(dagtasks.deploy, p["spec"], p["version"])

    @task
    def health_gate():
        p = dagkit.params_of()
        return dagkit.run(dagtasks.health_gate, p["spec"], "", p["health_timeout_s"], "after deploy")

    provision() >> deploy() >> health_gate()


tidelog_deploy()
