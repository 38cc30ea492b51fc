"""A Python program with requirements of its own (requirements.txt): the agent installs them before the
program runs. The ConfigMap is registered by its Kubernetes type token, so the program needs no
provider SDK; the pulumi-kubernetes provider itself is the workspace image's."""

import pulumi
import semver

config = pulumi.Config()
release = semver.Version.parse(config.get("release") or "1.2.3")
data = {"release": str(release), "next": str(release.bump_minor())}
settings = pulumi.CustomResource(
    "kubernetes:core/v1:ConfigMap",
    "release",
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "python-release"}, "data": data},
)
pulumi.export("next", data["next"])
