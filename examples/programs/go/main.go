// A Go program on the Pulumi SDK alone: the ConfigMap is registered by its Kubernetes type token, and the
// engine runs the pulumi-kubernetes provider at the version named here (the workspace image's, so an
// air-gapped cluster downloads no plugin). The workspace image compiles it with its Go toolchain.
package main

import (
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

type ConfigMap struct {
	pulumi.CustomResourceState
	Data pulumi.StringMapOutput `pulumi:"data"`
}

func main() {
	pulumi.Run(func(ctx *pulumi.Context) error {
		var settings ConfigMap
		err := ctx.RegisterResource("kubernetes:core/v1:ConfigMap", "settings", pulumi.Map{
			"apiVersion": pulumi.String("v1"),
			"kind":       pulumi.String("ConfigMap"),
			"metadata":   pulumi.Map{"name": pulumi.String("golang-settings")},
			"data":       pulumi.StringMap{"language": pulumi.String("go")},
		}, &settings, pulumi.Version("4.25.0"))
		if err != nil {
			return err
		}
		ctx.Export("language", settings.Data.MapIndex(pulumi.String("language")))
		return nil
	})
}
