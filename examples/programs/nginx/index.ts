// The seed walkthrough's kubernetes-ts-nginx with a Service in front. The container image (and, for an
// image that is not nginx, its command) comes from the stack's config, so one program runs a public
// nginx on any cluster and the local node's own web server where no registry is reachable.
import * as k8s from "@pulumi/kubernetes";
import * as pulumi from "@pulumi/pulumi";

const config = new pulumi.Config();
const image = config.require("image");
const command = config.get("command")?.split(" ");

const appLabels = { app: "nginx" };
const deployment = new k8s.apps.v1.Deployment("nginx", {
    spec: {
        selector: { matchLabels: appLabels },
        replicas: 1,
        template: {
            metadata: { labels: appLabels },
            spec: {
                // What the `restricted` Pod Security Standard asks of every pod.
                securityContext: {
                    runAsNonRoot: true, runAsUser: 101, seccompProfile: { type: "RuntimeDefault" },
                },
                containers: [{
                    name: "nginx",
                    image,
                    command,
                    ports: [{ containerPort: 8080 }],
                    readinessProbe: { httpGet: { path: "/", port: 8080 }, periodSeconds: 1 },
                    securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ["ALL"] } },
                }],
            },
        },
    },
});
const service = new k8s.core.v1.Service("nginx", {
    spec: { selector: appLabels, ports: [{ port: 80, targetPort: 8080 }] },
});

export const name = deployment.metadata.name;
export const serviceName = service.metadata.name;
export const clusterIP = service.spec.clusterIP;
