-- Argo CD action "approve" for pko's pulumi.com/Stack: approves the plan the Stack awaits
-- approval of, by setting the annotation pulumi.com/approved-plan to status.plan.digest (the
-- operator goes ahead only when the annotation names the plan it awaits).
-- Same sandbox as health.lua. Refuses when no plan awaits approval: an approval must name the
-- plan that was reviewed, never whatever plan comes next.

local status = obj.status or {}
local plan = status.plan or {}
local awaiting = false
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Ready" and c.status == "False" and c.reason == "AwaitingApproval" then
      awaiting = true
    end
  end
end
if not awaiting or plan.digest == nil or plan.digest == "" then
  error("no plan awaits approval on this Stack (Ready is not AwaitingApproval with status.plan.digest)")
end

if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["pulumi.com/approved-plan"] = plan.digest
return obj
