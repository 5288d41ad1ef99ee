"""Provider `static`: an inventory of existing hosts (real VMs) reachable over SSH.

Nothing is created or destroyed: `up` checks every host answers over SSH with a known host
key and has the spec's Python; `down` says there is nothing to remove.
"""

from __future__ import annotations

from infra.providers.base import Faults, Provider, ProviderError, SSHFaults


class StaticProvider(Provider):
    kind = "static"

    def up(self) -> dict:
        st = self.status()
        bad = [f"{h['name']}: {h['error']}" for h in st["hosts"] if h["state"] != "up"]
        if bad:
            raise ProviderError("static hosts not reachable:\n  " + "\n  ".join(bad))
        noconda = [h["name"] for h in st["hosts"] if not h.get("python", "").startswith("Python 3.11")]
        if noconda:
            raise ProviderError(f"{noconda}: `{self.spec.python}` is not Python 3.11 there "
                                f"(set `python:` in the spec to the right interpreter)")
        self.save_inventory()
        return {"cluster": self.spec.name, "provider": self.kind, "made": [],
                "hosts": {h["name"]: h["address"] for h in st["hosts"]}}

    def down(self) -> dict:
        return {"cluster": self.spec.name, "provider": self.kind, "removed": [],
                "note": "static hosts are not ours to remove; `tidelog stop` stops the brokers"}

    def faults(self) -> Faults:
        return SSHFaults(self)
