// Command allocbench times Kubernetes' own DRA allocator
// (k8s.io/dynamic-resource-allocation/structured at the release tests/kube pins, the code the
// scheduler's DynamicResources filter runs per node) on gpuslice's slot-mode devices, for the
// claim shapes that can reach a 1.34/1.35 scheduler: the decision time of one node per shape
// and allocator variant (stable: what 1.34/1.35 run; incubating: 1.36+ defaults; experimental:
// alpha gates), with the scheduler's 10 s filter timeout. scripts/bench-dra-allocator.sh builds
// and runs it; docs/benchmarks.md ("DRA allocator") records the table.
//
// The node's ResourceSlice is built as kube/plugin/src/slices.rs publishes slot mode: per GPU
// N devices gpu-<i>-slot-<j> with the attributes uuid, index, productName, slot and the
// capacities memory (the GPU's bytes / N, rounded down to 1Mi) and cores (100 / N). Slots
// claims already hold are passed as allocated devices, the lowest of each GPU (the plugin
// keeps held slots published).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

const (
	driver     = "gpuslice.io"
	slotsClass = "slots.gpuslice.io"
	gpuMemory  = 141 << 30 // an H200
	uuidAttr   = "gpuslice.io/uuid"
)

// classes: the shipped DeviceClasses; old: before class gpuslice.io stopped selecting slots.
func classes(old bool) map[string]*resourceapi.DeviceClass {
	capacityExpr := `device.driver == "gpuslice.io" && !("slot" in device.attributes["gpuslice.io"])`
	if old {
		capacityExpr = `device.driver == "gpuslice.io"`
	}
	mk := func(name, expr string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{
				{CEL: &resourceapi.CELDeviceSelector{Expression: expr}},
			}},
		}
	}
	return map[string]*resourceapi.DeviceClass{
		driver:     mk(driver, capacityExpr),
		slotsClass: mk(slotsClass, `device.driver == "gpuslice.io" && "slot" in device.attributes["gpuslice.io"]`),
	}
}

type lister map[string]*resourceapi.DeviceClass

func (l lister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l lister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("device class %s not found", name)
}

// node: GPUs with free[i] of n slots free (the others held by claims).
type node struct {
	n    int
	free []int
}

func (nd node) String() string {
	parts := make([]string, len(nd.free))
	for i, f := range nd.free {
		parts[i] = strconv.Itoa(f)
	}
	return fmt.Sprintf("%d GPUs × %d slots, free %s", len(nd.free), nd.n, strings.Join(parts, ","))
}

func slice(nd node) (*resourceapi.ResourceSlice, sets.Set[structured.DeviceID]) {
	memory := resource.MustParse(fmt.Sprintf("%dMi", gpuMemory/int64(nd.n)>>20))
	cores := resource.MustParse(strconv.Itoa(100 / nd.n))
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "node-gpuslice.io"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To("node"),
			Pool:     resourceapi.ResourcePool{Name: "node", Generation: 1, ResourceSliceCount: 1},
		},
	}
	allocated := sets.New[structured.DeviceID]()
	for i, free := range nd.free {
		for j := 0; j < nd.n; j++ {
			name := fmt.Sprintf("gpu-%d-slot-%d", i, j)
			s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
				Name: name,
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"uuid":        {StringValue: ptr.To(fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i))},
					"index":       {IntValue: ptr.To(int64(i))},
					"productName": {StringValue: ptr.To("NVIDIA H200")},
					"slot":        {IntValue: ptr.To(int64(j))},
				},
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"memory": {Value: memory},
					"cores":  {Value: cores},
				},
			})
			if j < nd.n-free {
				allocated.Insert(structured.MakeDeviceID(driver, "node", name))
			}
		}
	}
	return s, allocated
}

// request builders -----------------------------------------------------------------------

type req struct {
	name      string
	class     string
	count     int64
	all       bool
	selectors []string
}

type claimSpec struct {
	requests    []req
	constraints [][]string // request-name lists constrained to one GPU ([] = all)
}

func sel(expr string) resourceapi.DeviceSelector {
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}
}

func (c claimSpec) claim(name string) *resourceapi.ResourceClaim {
	rc := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
	}
	for _, r := range c.requests {
		e := &resourceapi.ExactDeviceRequest{DeviceClassName: r.class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: r.count}
		if r.all {
			e.AllocationMode = resourceapi.DeviceAllocationModeAll
			e.Count = 0
		}
		for _, s := range r.selectors {
			e.Selectors = append(e.Selectors, sel(s))
		}
		rc.Spec.Devices.Requests = append(rc.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: r.name, Exactly: e})
	}
	for _, names := range c.constraints {
		rc.Spec.Devices.Constraints = append(rc.Spec.Devices.Constraints, resourceapi.DeviceConstraint{
			Requests: names, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(uuidAttr)),
		})
	}
	return rc
}

// countShape: one request per GPU of `count: k` slots, each with its own constraint to one GPU
// (the webhook's slot claim before the bounds).
func countShape(gpus, k int) claimSpec {
	var c claimSpec
	for g := 0; g < gpus; g++ {
		name := "gpu"
		if gpus > 1 {
			name = fmt.Sprintf("gpu-%d", g)
		}
		c.requests = append(c.requests, req{name: name, class: slotsClass, count: int64(k)})
		c.constraints = append(c.constraints, []string{name})
	}
	return c
}

// pinnedShape: the webhook's claim for whole GPUs in slot mode — per GPU, one single-slot
// request per slot number j whose selector pins slot == j, the GPU's requests under one
// constraint to one GPU (kube/plugin/src/claim_shape.rs, whole_gpus).
func pinnedShape(gpus, n int, extra []string) claimSpec {
	var c claimSpec
	for g := 0; g < gpus; g++ {
		var names []string
		for j := 0; j < n; j++ {
			name := fmt.Sprintf("gpu-%d-slot-%d", g, j)
			sels := append([]string{fmt.Sprintf(`device.attributes["gpuslice.io"].slot == %d`, j)}, extra...)
			c.requests = append(c.requests, req{name: name, class: slotsClass, count: 1, selectors: sels})
			names = append(names, name)
		}
		c.constraints = append(c.constraints, names)
	}
	return c
}

// pinnedGroups: one constraint group per entry, each a single request pinning that slot.
func pinnedGroups(n int, pins []int) claimSpec {
	var c claimSpec
	for g, j := range pins {
		name := fmt.Sprintf("gpu-%d", g)
		c.requests = append(c.requests, req{name: name, class: slotsClass, count: 1,
			selectors: []string{fmt.Sprintf(`device.attributes["gpuslice.io"].slot == %d`, j)}})
		c.constraints = append(c.constraints, []string{name})
	}
	return c
}

type shape struct {
	name   string
	node   node
	old    bool // the DeviceClass gpuslice.io as shipped before (selecting slots too)
	claims []claimSpec
}

func repeat(c claimSpec, n int) []claimSpec {
	out := make([]claimSpec, n)
	for i := range out {
		out[i] = c
	}
	return out
}

func free(gpus, n int, first ...int) node {
	f := make([]int, gpus)
	for i := range f {
		f[i] = n
		if i < len(first) {
			f[i] = first[i]
		} else if len(first) > 0 {
			f[i] = first[len(first)-1]
		}
	}
	return node{n: n, free: f}
}

func shapes(n, g int) []shape {
	nothing := `device.attributes["gpuslice.io"].productName == "none"`
	fourPlusNothing := claimSpec{requests: []req{
		{name: "a", class: slotsClass, count: 1}, {name: "b", class: slotsClass, count: 1},
		{name: "c", class: slotsClass, count: 1}, {name: "d", class: slotsClass, count: 1},
		{name: "e", class: slotsClass, count: 1, selectors: []string{nothing}},
	}}
	// Fragmented nodes of g GPUs: one (two) GPUs wholly free, the rest with n-1 free.
	frag1 := free(g, n, n, n-1)
	frag2 := free(g, n, n, n, n-1)
	return []shape{
		// Before the bounds.
		{name: "before: 13 containers × 1Mi via the webhook (13 one-slot claims)", node: free(2, n), claims: repeat(countShape(1, 1), 13)},
		{name: "before: 4 one-slot requests + 1 matching nothing, one claim", node: free(g, n), claims: []claimSpec{fourPlusNothing}},
		{name: "before: 4 one-slot requests + 1 matching nothing, one claim", node: free(2, n), claims: []claimSpec{fourPlusNothing}},
		{name: "before: gpus 2, whole GPUs (webhook: 2 × count n)", node: frag1, claims: []claimSpec{countShape(2, n)}},
		{name: "before: gpus 3, whole GPUs (webhook: 3 × count n)", node: frag2, claims: []claimSpec{countShape(3, n)}},
		{name: "before: 2 containers × 1 whole GPU (2 claims of count n)", node: frag1, claims: repeat(countShape(1, n), 2)},
		{name: "before: class gpuslice.io count 13 (selects slots)", node: free(2, n), old: true, claims: []claimSpec{{requests: []req{{name: "gpu", class: driver, count: 13}}}}},
		{name: "before: allocationMode All of slots.gpuslice.io", node: free(g, n), claims: []claimSpec{{requests: []req{{name: "gpu", class: slotsClass, all: true}}}}},
		// After the bounds: what the webhook now writes for the same asks, and the worst the
		// policy admits.
		{name: "after: 13 containers × 1Mi via the webhook (one shared slot claim, node full)", node: free(2, n, 0), claims: []claimSpec{countShape(1, 1)}},
		{name: "after: gpus 2, whole GPUs (webhook: slot == j)", node: frag1, claims: []claimSpec{pinnedShape(2, n, nil)}},
		{name: "after: gpus 3, whole GPUs (webhook: slot == j)", node: frag2, claims: []claimSpec{pinnedShape(3, n, nil)}},
		{name: "after: 2 containers × 1 whole GPU via the webhook (one shared claim of count n)", node: free(g, n, n-1), claims: []claimSpec{countShape(1, n)}},
		{name: "after: class gpuslice.io count 13 (selects no slot)", node: free(2, n), claims: []claimSpec{{requests: []req{{name: "gpu", class: driver, count: 13}}}}},
		{name: "after, worst admitted: gpus 5 whole (30 pinned requests), 4 GPUs wholly free", node: free(g, n, n, n, n, n, n-1), claims: []claimSpec{pinnedShape(5, n, nil)}},
		{name: "after, worst admitted: one request of count n, every GPU n-1 free", node: free(g, n, n-1), claims: []claimSpec{countShape(1, n)}},
		{name: "after, worst admitted: gpus 5 whole (30 pinned requests), every GPU n-1 free", node: free(g, n, n-1), claims: []claimSpec{pinnedShape(5, n, nil)}},
		// Pinned requests that are not whole GPUs (refused by slot-claims-policy.yaml).
		{name: "claim policy: 4 GPUs pinning slot 0 + 1 pinning a slot no GPU has", node: free(g, n), claims: []claimSpec{pinnedGroups(n, []int{0, 0, 0, 0, 99})}},
		// What slot-claims-policy.yaml cannot see: several admitted claims in one pod, written by
		// hand (refused by slot-pods-policy.yaml).
		{name: "pod policy: 2 hand-written claims of count n in one pod", node: free(g, n, n, n-1), claims: repeat(countShape(1, n), 2)},
	}
}

func stats(a structured.Allocator) int64 {
	m := reflect.ValueOf(a).MethodByName("GetStats")
	if !m.IsValid() {
		return -1
	}
	out := m.Call(nil)
	if len(out) != 1 {
		return -1
	}
	f := out[0].FieldByName("NumAllocateOneInvocations")
	if !f.IsValid() {
		return -1
	}
	return f.Int()
}

func main() {
	variants := flag.String("variants", "stable,incubating,experimental", "allocator variants to run")
	timeout := flag.Duration("timeout", 10*time.Second, "per-node filter timeout (the scheduler's DRASchedulerFilterTimeout)")
	slots := flag.Int("slots", 6, "slots per GPU (dra.slots_per_gpu)")
	gpus := flag.Int("gpus", 8, "GPUs of the larger node")
	only := flag.String("only", "", "run only the shapes whose name contains this")
	flag.Parse()

	features := structured.Features{AdminAccess: true, PrioritizedList: true}
	k8sNode := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"}}
	fmt.Printf("| shape | node | allocator | decision | time | search steps |\n|---|---|---|---|---|---|\n")
	for _, sh := range shapes(*slots, *gpus) {
		if *only != "" && !strings.Contains(sh.name, *only) {
			continue
		}
		s, allocated := slice(sh.node)
		var claims []*resourceapi.ResourceClaim
		for i, c := range sh.claims {
			claims = append(claims, c.claim(fmt.Sprintf("c%d", i)))
		}
		for _, variant := range strings.Split(*variants, ",") {
			structured.EnableAllocators(variant)
			celCache := cel.NewCache(100, cel.Features{})
			state := structured.AllocatedState{AllocatedDevices: allocated, AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}
			a, err := structured.NewAllocator(context.Background(), features, state, lister(classes(sh.old)), []*resourceapi.ResourceSlice{s}, celCache)
			if err != nil {
				fmt.Fprintf(os.Stderr, "allocbench: %s: %v\n", variant, err)
				os.Exit(1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			start := time.Now()
			result, err := a.Allocate(ctx, k8sNode, claims)
			took := time.Since(start)
			cancel()
			decision := "Unschedulable (fits nowhere)"
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				decision = "**timed out: SchedulerError**"
			case err != nil && errors.Is(err, structured.ErrFailedAllocationOnNode):
				decision = "Unschedulable: " + err.Error()
			case err != nil:
				decision = "**error: SchedulerError** (" + err.Error() + ")"
			case result != nil:
				decision = "fits"
			}
			fmt.Printf("| %s | %s | %s | %s | %s | %d |\n", sh.name, sh.node, variant, decision, took.Round(time.Millisecond), stats(a))
		}
	}
}
