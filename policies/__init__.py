"""The routing policy: model of the YAML (`policies.model`), loading with precise errors (`policies.loader`),
evaluation Features → Decision (`policies.engine`), classification of a request into Features under a policy
(`policies.classify`), hot reload keeping the last good policy (`policies.store`), and the operator CLI.
"""
