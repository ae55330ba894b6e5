// Command capmox drives CAPMOX's own IPAM helper (package pkg/kubernetes/ipam of
// github.com/ionos-cloud/cluster-api-provider-proxmox, pinned in go.mod) against an API server, the way CAPMOX's
// cluster and machine reconcilers call it, and prints what it saw as JSON on stdout:
//
//	capmox pools   --kubeconfig K --namespace N --cluster C
//	capmox claim   --kubeconfig K --namespace N --cluster C --machine M [--device net0]
//	capmox resolve --kubeconfig K --namespace N --cluster C --machine M [--device net0]
//
// `pools` runs CreateOrUpdateInClusterIPPool for the ProxmoxCluster C (which, and its owner Cluster, must exist),
// records every write it sends, and stores the pools in C's status as CAPMOX's cluster reconciler does. `claim`
// creates the claims of the ProxmoxMachine M's device (one per pool of its zone, the default-gateway device as
// CAPMOX's machine reconciler builds them) and `resolve` resolves them with ResolveIPAddressClaim.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ipamicv1 "sigs.k8s.io/cluster-api-ipam-provider-in-cluster/api/v1alpha2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	infrav1 "github.com/ionos-cloud/cluster-api-provider-proxmox/api/v1alpha2"
	"github.com/ionos-cloud/cluster-api-provider-proxmox/pkg/consts"
	"github.com/ionos-cloud/cluster-api-provider-proxmox/pkg/kubernetes/ipam"
)

type options struct {
	kubeconfig, namespace, cluster, machine, device string
}

// write is one create, update or patch the helper sent to the API server.
type write struct {
	Verb string `json:"verb"`
	Kind string `json:"kind"`
	Name string `json:"name"`
}

// recorder wraps a client and records the writes sent through it.
type recorder struct {
	writes []write
}

func (r *recorder) note(c client.WithWatch, verb string, obj client.Object) {
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if gvk, err := apiutil.GVKForObject(obj, c.Scheme()); err == nil {
		kind = gvk.Kind
	}
	r.writes = append(r.writes, write{Verb: verb, Kind: kind, Name: obj.GetName()})
}

func (r *recorder) wrap(c client.WithWatch) client.Client {
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			r.note(c, "create", obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			r.note(c, "update", obj)
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			r.note(c, "patch", obj)
			return c.Patch(ctx, obj, p, opts...)
		},
	})
}

func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, clusterv1.AddToScheme, ipamv1.AddToScheme, ipamicv1.AddToScheme, infrav1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

func newClient(kubeconfig string, rec *recorder) (client.Client, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return rec.wrap(c), nil
}

func parse(args []string) (string, options, error) {
	var o options
	if len(args) < 1 {
		return "", o, fmt.Errorf("usage: capmox pools|claim|resolve --kubeconfig K --namespace N --cluster C [--machine M]")
	}
	flags := flag.NewFlagSet(args[0], flag.ContinueOnError)
	flags.StringVar(&o.kubeconfig, "kubeconfig", "", "admin kubeconfig")
	flags.StringVar(&o.namespace, "namespace", "", "namespace of the ProxmoxCluster and ProxmoxMachines")
	flags.StringVar(&o.cluster, "cluster", "", "ProxmoxCluster name")
	flags.StringVar(&o.machine, "machine", "", "ProxmoxMachine name (claim, resolve)")
	flags.StringVar(&o.device, "device", string(infrav1.DefaultNetworkDevice), "the machine's network device")
	if err := flags.Parse(args[1:]); err != nil {
		return "", o, err
	}
	if o.kubeconfig == "" || o.namespace == "" || o.cluster == "" || (args[0] != "pools" && o.machine == "") {
		return "", o, fmt.Errorf("%s: --kubeconfig, --namespace and --cluster are required (and --machine)", args[0])
	}
	return args[0], o, nil
}

func run(ctx context.Context, command string, o options) (any, error) {
	rec := &recorder{}
	c, err := newClient(o.kubeconfig, rec)
	if err != nil {
		return nil, err
	}
	switch command {
	case "pools":
		return pools(ctx, c, rec, o)
	case "claim":
		return claim(ctx, c, rec, o)
	case "resolve":
		return resolve(ctx, c, o)
	}
	return nil, fmt.Errorf("unknown command %q (pools, claim, resolve)", command)
}

func main() {
	command, o, err := parse(os.Args[1:])
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var out any
		out, err = run(ctx, command, o)
		cancel()
		if err == nil {
			err = json.NewEncoder(os.Stdout).Encode(out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "capmox harness:", err)
		os.Exit(1)
	}
}

// poolView is one InClusterIPPool as the API server returned it to CAPMOX's helper.
type poolView struct {
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
	Generation      int64  `json:"generation"`
}

// poolsResult is what `pools` prints.
type poolsResult struct {
	Writes []write    `json:"writes"`
	Pools  []poolView `json:"pools"`
	Zones  []zoneView `json:"zones"`
	Panics []string   `json:"capmoxPanics"`
}

type zoneView struct {
	Zone string `json:"zone"`
	IPv4 string `json:"ipv4"`
	IPv6 string `json:"ipv6"`
}

func getCluster(ctx context.Context, c client.Client, o options) (*infrav1.ProxmoxCluster, error) {
	cluster := &infrav1.ProxmoxCluster{}
	return cluster, c.Get(ctx, client.ObjectKey{Namespace: o.namespace, Name: o.cluster}, cluster)
}

// poolNames lists the pools CAPMOX's cluster reconciler expects, in its order: the default zone's, then each zone's.
func poolNames(cluster *infrav1.ProxmoxCluster) []string {
	var names []string
	add := func(zone infrav1.Zone, v4, v6 *infrav1.IPConfigSpec) {
		if v4 != nil {
			names = append(names, ipam.InClusterPoolFormat(cluster, zone, infrav1.IPv4Format))
		}
		if v6 != nil {
			names = append(names, ipam.InClusterPoolFormat(cluster, zone, infrav1.IPv6Format))
		}
	}
	add(nil, cluster.Spec.IPv4Config, cluster.Spec.IPv6Config)
	for _, zone := range cluster.Spec.ZoneConfigs {
		add(zone.Zone, zone.IPv4Config, zone.IPv6Config)
	}
	return names
}

// setPoolRef records the pool in the cluster's status with CAPMOX's own SetInClusterIPPoolRef; if that panics (it
// indexes one past the end when it appends a second zone), the panic is returned and the zone's reference is set here.
func setPoolRef(cluster *infrav1.ProxmoxCluster, pool client.Object) (panicked string) {
	defer func() {
		if r := recover(); r != nil {
			panicked = fmt.Sprint(r)
			setZoneRef(cluster, pool)
		}
	}()
	cluster.SetInClusterIPPoolRef(pool)
	return ""
}

func setZoneRef(cluster *infrav1.ProxmoxCluster, pool client.Object) {
	zone := pool.GetLabels()[infrav1.ProxmoxZoneLabel]
	refs := &cluster.Status.InClusterZoneRef
	index := slices.IndexFunc(*refs, func(r infrav1.InClusterZoneRef) bool { return ptr.Deref(r.Zone, "") == zone })
	if index < 0 {
		*refs = append(*refs, infrav1.InClusterZoneRef{Zone: ptr.To(zone)})
		index = len(*refs) - 1
	}
	ref := &corev1.LocalObjectReference{Name: pool.GetName()}
	if pool.GetAnnotations()[infrav1.ProxmoxIPFamilyAnnotation] == infrav1.IPv6Type {
		(*refs)[index].InClusterIPPoolRefV6 = ref
	} else {
		(*refs)[index].InClusterIPPoolRefV4 = ref
	}
}

func pools(ctx context.Context, c client.Client, rec *recorder, o options) (any, error) {
	cluster, err := getCluster(ctx, c, o)
	if err != nil {
		return nil, err
	}
	helper := ipam.NewHelper(c, cluster.DeepCopy())
	if err := helper.CreateOrUpdateInClusterIPPool(ctx); err != nil {
		return nil, fmt.Errorf("CreateOrUpdateInClusterIPPool: %w", err)
	}
	result := poolsResult{Writes: append([]write{}, rec.writes...), Pools: []poolView{}, Panics: []string{}}
	for _, name := range poolNames(cluster) {
		pool, err := helper.GetIPPool(ctx, corev1.TypedLocalObjectReference{
			APIGroup: consts.GetIPAMInClusterAPIGroup(), Kind: consts.GetInClusterIPPoolKind(), Name: name,
		})
		if err != nil {
			return nil, err
		}
		result.Pools = append(result.Pools, poolView{name, pool.GetResourceVersion(), pool.GetGeneration()})
		if panicked := setPoolRef(cluster, pool); panicked != "" {
			result.Panics = append(result.Panics, fmt.Sprintf("SetInClusterIPPoolRef(%s): %s", name, panicked))
		}
	}
	if err := c.Status().Update(ctx, cluster); err != nil {
		return nil, fmt.Errorf("storing the pools in the ProxmoxCluster's status: %w", err)
	}
	for _, ref := range cluster.Status.InClusterZoneRef {
		view := zoneView{Zone: ptr.Deref(ref.Zone, "")}
		if ref.InClusterIPPoolRefV4 != nil {
			view.IPv4 = ref.InClusterIPPoolRefV4.Name
		}
		if ref.InClusterIPPoolRefV6 != nil {
			view.IPv6 = ref.InClusterIPPoolRefV6.Name
		}
		result.Zones = append(result.Zones, view)
	}
	return result, nil
}

// machineHelper reads the ProxmoxCluster and ProxmoxMachine and builds the claim definitions of the machine's device
// as CAPMOX's machine reconciler does for a device with defaultIPv4 and defaultIPv6: the zone's IPv4 pool at offset
// 0, its IPv6 pool at offset 1, both marked as carrying the default gateway.
func machineHelper(ctx context.Context, c client.Client, o options) (*ipam.Helper, *infrav1.ProxmoxMachine, []ipam.IPClaimDef, error) {
	cluster, err := getCluster(ctx, c, o)
	if err != nil {
		return nil, nil, nil, err
	}
	machine := &infrav1.ProxmoxMachine{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.namespace, Name: o.machine}, machine); err != nil {
		return nil, nil, nil, err
	}
	helper := ipam.NewHelper(c, cluster)
	zonePools, err := helper.GetInClusterPools(ctx, machine)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("GetInClusterPools: %w", err)
	}
	var refs []corev1.TypedLocalObjectReference
	if zonePools.IPv4 != nil {
		refs = append(refs, zonePools.IPv4.PoolRef)
	}
	if zonePools.IPv6 != nil {
		refs = append(refs, zonePools.IPv6.PoolRef)
	}
	defs := make([]ipam.IPClaimDef, 0, len(refs))
	for offset, ref := range refs {
		defs = append(defs, ipam.IPClaimDef{Device: infrav1.NetName(o.device), PoolRef: ref, Annotations: map[string]string{
			infrav1.ProxmoxPoolOffsetAnnotation:     strconv.Itoa(offset),
			infrav1.ProxmoxDefaultGatewayAnnotation: "true",
		}})
	}
	return helper, machine, defs, nil
}

// claimResult is what `claim` prints.
type claimResult struct {
	Writes []write `json:"writes"`
}

func claim(ctx context.Context, c client.Client, rec *recorder, o options) (any, error) {
	helper, machine, defs, err := machineHelper(ctx, c, o)
	if err != nil {
		return nil, err
	}
	for _, def := range defs {
		if err := helper.CreateIPAddressClaim(ctx, machine, def); err != nil {
			return nil, fmt.Errorf("CreateIPAddressClaim(%s): %w", def.PoolRef.Name, err)
		}
	}
	return claimResult{Writes: append([]write{}, rec.writes...)}, nil
}

// resolution is one ResolveIPAddressClaim result, with the IPAddress it returned (if resolved).
type resolution struct {
	Claim          string                `json:"claim"`
	Pool           string                `json:"pool"`
	Status         string                `json:"status"`
	ConflictReason string                `json:"conflictReason"`
	Address        *ipamv1.IPAddressSpec `json:"address"`
	AddressName    string                `json:"addressName"`
	Annotations    map[string]string     `json:"annotations"`
	Orphaned       string                `json:"orphanedAddress"`
}

func resolve(ctx context.Context, c client.Client, o options) (any, error) {
	helper, machine, defs, err := machineHelper(ctx, c, o)
	if err != nil {
		return nil, err
	}
	results := []resolution{}
	for _, def := range defs {
		got, err := helper.ResolveIPAddressClaim(ctx, machine, def)
		if err != nil {
			return nil, fmt.Errorf("ResolveIPAddressClaim(%s): %w", def.PoolRef.Name, err)
		}
		view := resolution{
			Claim: got.ClaimName, Pool: def.PoolRef.Name, Status: string(got.Status), ConflictReason: string(got.ConflictReason),
			Orphaned: got.OrphanedAddressName,
		}
		if got.Address != nil {
			view.Address, view.AddressName, view.Annotations = &got.Address.Spec, got.Address.Name, got.Address.Annotations
		}
		results = append(results, view)
	}
	return results, nil
}
