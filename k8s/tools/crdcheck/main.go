// crdcheck validates the CouponEvent CRD and objects against it with the API server's own code
// (k8s.io/apiextensions-apiserver): CRD validation (CEL compile and cost limits included),
// openAPI schema, list-map keys and CEL rules. Files named bad-*.yaml must be refused, every
// other file accepted; the exit code is 1 otherwise. Run it with k8s/tools/crdcheck.sh.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsinstall "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// usage: crdcheck CRD.yaml OBJ.yaml...  (each OBJ file: one object; prints OK or errors)
func main() {
	scheme := runtime.NewScheme()
	apiextensionsinstall.Install(scheme)
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	var v1crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &v1crd); err != nil {
		panic(err)
	}
	scheme.Default(&v1crd)
	var crd apiextensions.CustomResourceDefinition
	if err := scheme.Convert(&v1crd, &crd, nil); err != nil {
		panic(err)
	}
	errs := validation.ValidateCustomResourceDefinition(context.TODO(), &crd)
	if len(errs) > 0 {
		fmt.Println("CRD INVALID:")
		for _, e := range errs {
			fmt.Println("  ", e)
		}
		os.Exit(1)
	}
	fmt.Println("CRD valid")
	var internal *apiextensions.JSONSchemaProps
	if crd.Spec.Validation != nil {
		internal = crd.Spec.Validation.OpenAPIV3Schema
	} else {
		internal = crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	}
	ss, err := structuralschema.NewStructural(internal)
	if err != nil {
		panic(err)
	}
	celValidator := cel.NewValidator(ss, true, celconfig.PerCallLimit)
	schemaValidator, _, err := apiservervalidation.NewSchemaValidator(internal)
	if err != nil {
		panic(err)
	}
	bad := 0
	for _, path := range os.Args[2:] {
		raw, err := os.ReadFile(path)
		if err != nil {
			panic(err)
		}
		var obj map[string]interface{}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			panic(err)
		}
		// The API server's JSON decoding: integers stay int64.
		if err := utiljson.Unmarshal(js, &obj); err != nil {
			panic(err)
		}
		var all field.ErrorList
		all = append(all, apiservervalidation.ValidateCustomResource(nil, obj, schemaValidator)...)
		all = append(all, listtype.ValidateListSetsAndMaps(nil, ss, obj)...)
		celErrs, _ := celValidator.Validate(context.TODO(), nil, ss, obj, nil, celconfig.RuntimeCELCostBudget)
		all = append(all, celErrs...)
		wantRefused := strings.HasPrefix(filepath.Base(path), "bad-")
		if len(all) == 0 {
			fmt.Printf("%s: accepted\n", path)
		}
		for _, e := range all {
			fmt.Printf("%s: refused: %v\n", path, e)
		}
		if wantRefused != (len(all) > 0) {
			fmt.Printf("%s: UNEXPECTED (want refused=%v)\n", path, wantRefused)
			bad++
		}
	}
	if bad > 0 {
		os.Exit(1)
	}
}
