"""The tools around the gateway: the `edgeroute` command line, the simulators
(`edgeroute.sim`), the QoS router's training (`edgeroute.qos`) and the benchmarks
(`edgeroute.bench`).

They sit above the gateway and the policies and may import them; nothing in
`gateway`, `policies` or `oracle` imports them (the import contract in pyproject.toml).
"""
