"""pko: the Pulumi Kubernetes Operator v2, in Python."""
