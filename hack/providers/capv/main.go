// Command capv-harness runs CAPV's own VSphereVM and VSphereCluster controllers (govmomi mode) against govmomi's
// vCenter simulator (vcsim), all in this process, for the providers' lane of the tests. It holds no provider logic
// of its own.
//
//	capv-harness serve --kubeconfig K --namespace N --state FILE
//	    starts vcsim, writes {"server", "username", "password"} to FILE (the spec.server of VSphereVMs and
//	    VSphereClusters, and the manager's credentials), and runs the controllers on namespace N until SIGTERM or
//	    SIGINT.
//	capv-harness inspect --state FILE --vm NAME
//	    prints, as JSON, what vcsim holds for the VM: {"found", "powerState", "metadata"} where metadata is the
//	    decoded guestinfo.metadata CAPV wrote (the cloud-init network configuration with the claimed addresses).
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"crypto/tls"
	"github.com/go-logr/logr"
	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/simulator"
	_ "github.com/vmware/govmomi/vapi/cluster/simulator" // the cluster-module endpoints CAPV's session opens
	_ "github.com/vmware/govmomi/vapi/simulator"         // the REST (tags) endpoints CAPV's session logs in to
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
	"net/url"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	infrav1 "sigs.k8s.io/cluster-api-provider-vsphere/api/govmomi/v1beta2"
	"sigs.k8s.io/cluster-api-provider-vsphere/controllers"
	capvcontext "sigs.k8s.io/cluster-api-provider-vsphere/pkg/context"
)

type state struct {
	Server   string `json:"server"`
	Username string `json:"username"`
	Password string `json:"password"`
}

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: capv-harness serve|inspect [flags]"))
	}
	flags := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "the management cluster's kubeconfig")
	namespace := flags.String("namespace", "", "the namespace whose VSphereVMs are reconciled")
	stateFile := flags.String("state", "", "where serve writes, and inspect reads, vcsim's address and login")
	vm := flags.String("vm", "", "the VM inspect reports on")
	_ = flags.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(ctx, *kubeconfig, *namespace, *stateFile)
	case "inspect":
		err = inspect(ctx, *stateFile, *vm)
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "capv-harness:", err)
	os.Exit(1)
}

// serve starts vcsim, then CAPV's VSphereVM and VSphereCluster controllers in a controller-runtime manager restricted
// to namespace.
func serve(ctx context.Context, kubeconfig, namespace, stateFile string) error {
	model := simulator.VPX()
	if err := model.Create(); err != nil {
		return err
	}
	defer model.Remove()
	model.Service.TLS = new(tls.Config)
	model.Service.RegisterEndpoints = true
	server := model.Service.NewServer()
	defer server.Close()
	password, _ := server.URL.User.Password()
	written, _ := json.Marshal(state{Server: server.URL.Host, Username: server.URL.User.Username(), Password: password})
	if err := os.WriteFile(stateFile+".partial", written, 0o600); err != nil {
		return err
	}
	if err := os.Rename(stateFile+".partial", stateFile); err != nil {
		return err
	}

	ctrl.SetLogger(zap.New(zap.UseDevMode(false)))
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, ipamv1.AddToScheme, infrav1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	watched := map[string]cache.Config{namespace: {}}
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   cache.Options{DefaultNamespaces: watched},
	})
	if err != nil {
		return err
	}
	managerContext := &capvcontext.ControllerManagerContext{
		Namespace: namespace, Name: "capv-harness", WatchNamespaces: watched, Client: mgr.GetClient(),
		Logger: ctrl.Log.WithName("capv-harness"), Scheme: scheme, Username: server.URL.User.Username(), Password: password,
	}
	clusterCache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{SecretClient: mgr.GetClient(), Client: clustercache.ClientOptions{UserAgent: "capv-harness"}},
		controller.Options{MaxConcurrentReconciles: 1})
	if err != nil {
		return err
	}
	if err := controllers.AddVMControllerToManager(ctx, managerContext, mgr, clusterCache, controller.Options{MaxConcurrentReconciles: 1}); err != nil {
		return err
	}
	// supervisorBased=false: the govmomi-mode reconciler, which logs in to spec.server with the manager's credentials.
	if err := controllers.AddClusterControllerToManager(ctx, managerContext, mgr, false, controller.Options{MaxConcurrentReconciles: 1}); err != nil {
		return err
	}
	return mgr.Start(logr.NewContext(ctx, ctrl.Log))
}

// inspect logs in to vcsim as CAPV did and reports the VM's power state and the metadata CAPV gave it.
func inspect(ctx context.Context, stateFile, name string) error {
	raw, err := os.ReadFile(stateFile)
	if err != nil {
		return err
	}
	var login state
	if err := json.Unmarshal(raw, &login); err != nil {
		return err
	}
	endpoint, err := soap.ParseURL(login.Server)
	if err != nil {
		return err
	}
	endpoint.User = url.UserPassword(login.Username, login.Password)
	vc, err := govmomi.NewClient(ctx, endpoint, true)
	if err != nil {
		return err
	}
	finder := find.NewFinder(vc.Client, true)
	datacenter, err := finder.DefaultDatacenter(ctx)
	if err != nil {
		return err
	}
	finder.SetDatacenter(datacenter)
	report := map[string]any{"found": false}
	found, err := finder.VirtualMachine(ctx, name)
	if err != nil {
		if _, missing := err.(*find.NotFoundError); missing {
			return json.NewEncoder(os.Stdout).Encode(report)
		}
		return err
	}
	var vm mo.VirtualMachine
	if err := found.Properties(ctx, found.Reference(), []string{"config.extraConfig", "runtime.powerState"}, &vm); err != nil {
		return err
	}
	report["found"], report["powerState"] = true, vm.Runtime.PowerState
	report["metadata"] = guestinfo(vm.Config.ExtraConfig, "guestinfo.metadata")
	return json.NewEncoder(os.Stdout).Encode(report)
}

// guestinfo decodes one guestinfo key CAPV wrote base64-encoded ("" when absent).
func guestinfo(extraConfig []types.BaseOptionValue, key string) string {
	for _, option := range extraConfig {
		value := option.GetOptionValue()
		if value.Key == key {
			decoded, err := base64.StdEncoding.DecodeString(fmt.Sprint(value.Value))
			if err != nil {
				return fmt.Sprint(value.Value)
			}
			return string(decoded)
		}
	}
	return ""
}
