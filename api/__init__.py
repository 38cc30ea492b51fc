"""pulumi.com/v1 and auto.pulumi.com/v1alpha1 API models, and the agent RPC definitions."""
