-- Argo CD action "refresh" for pko's pulumi.com/Stack: asks the operator for one refresh of the
-- stack's state, by setting the annotation pulumi.com/refresh-request to a new token (the time,
-- UTC, to the second: what Argo's own restart actions use; any new value is a new request).
-- Same sandbox as health.lua: os.date is one of the two os functions Argo CD allows.

if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["pulumi.com/refresh-request"] = os.date("!%Y-%m-%dT%XZ")
return obj
