-- Argo CD action discovery for pko's pulumi.com/Stack: which actions the Stack offers now.
-- Same sandbox as health.lua (Lua 5.1, base/table/package, os.time and os.date only).
--
--   approve  while the Stack awaits approval of a plan (Ready=False reason AwaitingApproval with
--            status.plan.digest) that is not approved yet
--   refresh  unless spec.suspend is set (then the operator starts no operation)
--   retry    after a failed update (status.lastUpdate.state "failed", or Stalled=True), while no
--            Update runs and spec.suspend is not set
-- An action not applicable is listed with disabled = true, so the UI shows it greyed out.

local actions = {}
local status = obj.status or {}
local annotations = obj.metadata.annotations or {}
local suspended = obj.spec ~= nil and obj.spec.suspend == true

local function condition(kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local ready = condition("Ready")
local stalled = condition("Stalled")
local plan = status.plan or {}
local awaiting = ready ~= nil and ready.status == "False" and ready.reason == "AwaitingApproval"
  and plan.digest ~= nil and plan.digest ~= ""
local approved = awaiting and annotations["pulumi.com/approved-plan"] == plan.digest
local lastUpdate = status.lastUpdate or {}
local failed = lastUpdate.state == "failed" or (stalled ~= nil and stalled.status == "True")

actions["approve"] = {
  ["disabled"] = not awaiting or approved,
  ["iconClass"] = "fa fa-fw fa-check",
  ["displayName"] = "Approve plan",
}
actions["refresh"] = {
  ["disabled"] = suspended,
  ["iconClass"] = "fa fa-fw fa-sync",
  ["displayName"] = "Refresh",
}
actions["retry"] = {
  ["disabled"] = suspended or not failed or status.currentUpdate ~= nil,
  ["iconClass"] = "fa fa-fw fa-redo",
  ["displayName"] = "Retry",
}
return actions
