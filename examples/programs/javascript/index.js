"use strict";
// A JavaScript program: no compile step, @pulumi/kubernetes from its package.json (the workspace image
// has it too, so a program without dependencies of its own installs nothing).
const k8s = require("@pulumi/kubernetes");
const pulumi = require("@pulumi/pulumi");

const greeting = new pulumi.Config().get("greeting") || "hello from javascript";
// No metadata.name: Pulumi names it `greeting-<random suffix>`, so several stacks of this program
// (examples/javascript, git-ssh, flux-source) can run in one namespace.
const settings = new k8s.core.v1.ConfigMap("greeting", { data: { greeting } });
exports.name = settings.metadata.name;
exports.greeting = settings.data["greeting"];
