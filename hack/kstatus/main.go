// kstatus prints what the kstatus library (sigs.k8s.io/cli-utils/pkg/kstatus/status) computes for each
// Kubernetes object it reads: Flux's health checks, `flux ... --wait`, kpt and cli-utils' appliers all
// judge a custom resource this way. The tests feed it Stacks exactly as the operator wrote them.
//
// Usage: kstatus < objects.json   (a JSON object, or a JSON list of objects, or a `kind: List`)
// Prints one JSON line per object: {"name": ..., "status": "Current|InProgress|Failed|...", "message": ...}.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kjson "k8s.io/apimachinery/pkg/util/json" // numbers as int64, as unstructured objects hold them
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var objects []map[string]interface{}
	if err := kjson.Unmarshal(input, &objects); err != nil {
		var one map[string]interface{}
		if err := kjson.Unmarshal(input, &one); err != nil {
			fail(fmt.Errorf("stdin is neither a JSON object nor a list of them: %w", err))
		}
		if items, ok := one["items"].([]interface{}); ok && one["kind"] == "List" {
			for _, item := range items {
				if obj, ok := item.(map[string]interface{}); ok {
					objects = append(objects, obj)
				}
			}
		} else {
			objects = []map[string]interface{}{one}
		}
	}
	out := json.NewEncoder(os.Stdout)
	for _, obj := range objects {
		u := &unstructured.Unstructured{Object: obj}
		computed, err := status.Compute(u)
		if err != nil {
			fail(fmt.Errorf("%s: %w", u.GetName(), err))
		}
		if err := out.Encode(result{u.GetName(), computed.Status.String(), computed.Message}); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus:", err)
	os.Exit(1)
}
