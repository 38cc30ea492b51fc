-- Argo CD health check for pko's pulumi.com/Stack (the resource.customizations.health entry).
--
-- Argo CD runs this in gopher-lua (Lua 5.1) with `obj` set to the live Stack and, for scripts from
-- argocd-cm, only the base, table and package libraries and os.time/os.date: no string or math
-- library, and no string methods. Messages are therefore built with `..` and tostring alone.
-- (Argo CD itself answers "Progressing: Pending deletion" for an object being deleted, and
-- "Missing" for one that is not there, before it runs this script.)
--
-- The mapping, from the Stack's conditions (pko/controllers/stack/status.py):
--   status not yet written for this generation           Progressing
--   Stalled=True (spec invalid, failure budget spent...)  Degraded, the Stalled message
--   Suspended=True (spec.suspend)                         Suspended
--   Ready=False reason AwaitingApproval (status.plan)     Suspended, the plan's summary and digest
--   Ready=False reason Cancelled (pulumi.com/cancel-request) Suspended: it waits for a person too
--   Reconciling=True reason RetryingAfterFailure or
--     PreviewFailed, after a failure that needs a fix     Degraded, the failure and the next retry
--   ... after a transient failure (lock, network, 5xx)    Progressing, the failure and the next retry
--   Reconciling=True otherwise                            Progressing, its message
--   Ready=True                                            Healthy (Drifted=True: Healthy, drift named)
--
-- Why a transient failure is Progressing, not Degraded: during a sync with waves Argo CD fails the
-- whole sync operation as soon as a resource of the running wave is Degraded, and notifications
-- fire on Degraded. A held stack lock or a 503 is retried within seconds to minutes and needs no
-- one; a program or config error is retried slowly and then Stalls, and someone has to fix it.
--
-- Why Drifted with Ready=True is Healthy: health answers "is the last deployment working", and
-- the drift is between the cloud and the stack's state, which Argo CD cannot show as OutOfSync
-- (only its own diff of the manifest does that). Degraded would fail every sync of the
-- Application and page people for a change made outside it, and it would stay Degraded until
-- someone runs an update; the message names the drift, so it shows in the UI and in
-- notifications on the health message, and the operator's own drift handling stays in charge.
--
-- Suspended (the plan awaits approval, an update was cancelled, or spec.suspend) holds a sync's
-- wave: Argo CD waits for Healthy or Degraded before the next wave, so resources after an
-- unapproved Stack wait for it.

local hs = {}

local function condition(status, kind)
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

local function isTrue(c)
  return c ~= nil and c.status == "True"
end

local function text(value, default)
  if value == nil or value == "" then
    return default
  end
  return tostring(value)
end

local function count(summary, op)
  if summary == nil or summary[op] == nil then
    return "0"
  end
  return tostring(summary[op])
end

local status = obj.status
if status == nil or status.observedGeneration == nil
    or status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. text(obj.metadata.generation, "1")
  return hs
end

local ready = condition(status, "Ready")
local stalled = condition(status, "Stalled")
local reconciling = condition(status, "Reconciling")

if isTrue(stalled) then
  hs.status = "Degraded"
  hs.message = text(stalled.message, text(stalled.reason, "the stack is stalled"))
  return hs
end

local suspended = condition(status, "Suspended")
if isTrue(suspended) then
  hs.status = "Suspended"
  hs.message = text(suspended.message, "spec.suspend is set")
  return hs
end

if ready ~= nil and ready.status == "False" and ready.reason == "AwaitingApproval" then
  local plan = status.plan or {}
  local digest = text(plan.digest, "(no digest yet)")
  hs.status = "Suspended"
  hs.message = "Plan " .. digest .. " awaits approval: "
    .. count(plan.summary, "create") .. " to create, "
    .. count(plan.summary, "update") .. " to update, "
    .. count(plan.summary, "delete") .. " to delete, "
    .. count(plan.summary, "replace") .. " to replace"
  if plan.update ~= nil then
    hs.message = hs.message .. " (preview Update " .. tostring(plan.update) .. ")"
  end
  hs.message = hs.message .. ". Run the approve action, or annotate pulumi.com/approved-plan=" .. digest
  return hs
end

if ready ~= nil and ready.status == "False" and ready.reason == "Cancelled" then
  hs.status = "Suspended"
  hs.message = text(ready.message, "the update was cancelled on request")
    .. ". Nothing runs until the next change; run the retry action to run it again"
  return hs
end

if isTrue(reconciling) then
  local reason = reconciling.reason
  if reason == "RetryingAfterFailure" or reason == "PreviewFailed" then
    -- Without lastFailure (a status the Go operator wrote) every failure counts, as in Go.
    local failure = status.lastFailure or {}
    local last = status.lastUpdate or {}
    local retry = ""
    if status.nextRetryTime ~= nil then
      retry = "; next retry at " .. tostring(status.nextRetryTime)
    end
    hs.message = text(failure.reason, "UpdateFailed") .. ": "
      .. text(failure.message, text(last.message, "the last update failed"))
      .. " (" .. text(reconciling.message, "retrying") .. retry .. ")"
    if failure.transient == true then
      hs.status = "Progressing"
    else
      hs.status = "Degraded"
    end
    return hs
  end
  hs.status = "Progressing"
  hs.message = text(reconciling.message, text(reason, "reconciliation is in progress"))
  return hs
end

if isTrue(ready) then
  hs.status = "Healthy"
  hs.message = text(ready.message, "the stack is up to date")
  local drifted = condition(status, "Drifted")
  if isTrue(drifted) then
    hs.message = hs.message .. "; drift detected: " .. text(drifted.message, text(drifted.reason, "Drifted"))
  end
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = text(ready.message, text(ready.reason, "Waiting for the stack to be reconciled"))
else
  hs.message = "Waiting for the stack to be reconciled"
end
return hs
