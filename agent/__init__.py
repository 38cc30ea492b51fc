"""The workspace agent: runs Pulumi operations for the operator behind TokenReview/SAR."""
