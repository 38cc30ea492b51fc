-- Argo CD action "retry" for pko's pulumi.com/Stack: asks the operator to run the stack's update
-- again now, by setting the annotation pulumi.com/reconciliation-request to a new token (the
-- Go operator's documented trigger). A new request also resets the failure count, so a Stalled
-- stack runs again without a change to its spec or source.
-- Same sandbox as health.lua: os.date is one of the two os functions Argo CD allows.

if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["pulumi.com/reconciliation-request"] = os.date("!%Y-%m-%dT%XZ")
return obj
