package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	kubelib "istio.io/istio/pkg/kube"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Labels and annotations that put a workload into ambient with HBONE.
const (
	// TunnelLabel with value "http" on a WorkloadEntry (or Pod) says the
	// workload terminates HBONE itself on 15008: Istio then marks it
	// tunnel_protocol HBONE and native_tunnel true. A VM running meshtun is
	// such a workload.
	TunnelLabel = "networking.istio.io/tunnel"
	// AmbientRedirectionAnnotation "enabled" is what istio-cni writes on a
	// Pod whose traffic it redirects to the node's ztunnel; Istio then marks
	// the workload tunnel_protocol HBONE (not native).
	AmbientRedirectionAnnotation = "ambient.istio.io/redirection"
	// DataplaneModeLabel "ambient" on a namespace or pod asks istio-cni to
	// redirect it; it is the input to the annotation above, not read by the
	// index for tunnel protocol.
	DataplaneModeLabel = "istio.io/dataplane-mode"
)

// NewPod returns a running, ready Pod with the ambient redirection annotation
// istio-cni writes, so the index serves it with HBONE.
func NewPod(namespace, name, serviceAccount, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   namespace,
			Labels:      labels,
			Annotations: map[string]string{AmbientRedirectionAnnotation: "enabled"},
		},
		Spec: corev1.PodSpec{ServiceAccountName: serviceAccount, NodeName: "node-" + name},
		Status: corev1.PodStatus{
			Phase:  corev1.PodRunning,
			PodIP:  ip,
			PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{
				Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(),
			}},
		},
	}
}

// ServicePort is one port of NewService.
type ServicePort struct {
	Name       string
	Port       int32
	TargetPort int32
}

// NewService returns a ClusterIP Service with the given VIP and selector.
func NewService(namespace, name, clusterIP string, selector map[string]string, ports ...ServicePort) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			Selector:   selector,
		},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name:       p.Name,
			Port:       p.Port,
			Protocol:   corev1.ProtocolTCP,
			TargetPort: intstr.FromInt32(p.TargetPort),
		})
	}
	return svc
}

// NewWorkloadEntry returns a WorkloadEntry for a machine outside Kubernetes
// that speaks HBONE itself (TunnelLabel "http"), such as a VM running
// meshtun. The labels are copied and the tunnel label added.
func NewWorkloadEntry(namespace, name, serviceAccount, ip string, labels map[string]string) *networkingv1.WorkloadEntry {
	all := map[string]string{TunnelLabel: "http"}
	for k, v := range labels {
		all[k] = v
	}
	return &networkingv1.WorkloadEntry{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: all},
		Spec: networkingapi.WorkloadEntry{
			Address:        ip,
			ServiceAccount: serviceAccount,
			Labels:         all,
		},
	}
}

// NetworkLabel is the label that puts a cluster (on the istio-system
// namespace) or a gateway into a network (topology.istio.io/network).
const NetworkLabel = "topology.istio.io/network"

// RemoteGatewayClass is the class of a Gateway that tells the local
// cluster's istiod where a network's east-west gateway listens
// (istio-remote): the ambient index then sets every workload of that
// network's network_gateway to its address and HBONE port.
const RemoteGatewayClass = "istio-remote"

// NewNetworkGateway returns the Gateway that declares the east-west
// gateway of network at addr, serving HBONE on port: a Gateway of class
// istio-remote with the network label, one HBONE listener, and addr in its
// status, the form istiod reads such a gateway in (its ambient index keeps
// a network's gateways by the network label). ApplyGateway writes it.
func NewNetworkGateway(namespace, name, network, addr string, port int) *gatewayv1.Gateway {
	ip := gatewayv1.IPAddressType
	return &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: namespace,
			Labels:    map[string]string{NetworkLabel: network},
		},
		Spec: gatewayv1.GatewaySpec{
			GatewayClassName: RemoteGatewayClass,
			Listeners: []gatewayv1.Listener{{
				Name:     "hbone",
				Port:     gatewayv1.PortNumber(port),
				Protocol: "HBONE",
			}},
		},
		Status: gatewayv1.GatewayStatus{
			Addresses: []gatewayv1.GatewayStatusAddress{{Type: &ip, Value: addr}},
		},
	}
}

// ApplyGateway creates or updates a Gateway (gateway.networking.k8s.io/v1),
// then writes its status (the addresses) as a gateway controller would.
func (c *ControlPlane) ApplyGateway(gw *gatewayv1.Gateway) error {
	api := c.fake.KubeClient().GatewayAPI().GatewayV1().Gateways(gw.Namespace)
	if err := apply("gateway", api, gw); err != nil {
		return err
	}
	if _, err := api.UpdateStatus(context.Background(), gw, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("controlplane: gateway %s/%s status: %w", gw.Namespace, gw.Name, err)
	}
	return nil
}

// DeleteGateway deletes a Gateway.
func (c *ControlPlane) DeleteGateway(namespace, name string) error {
	return remove("gateway", namespace, name, c.fake.KubeClient().GatewayAPI().GatewayV1().Gateways(namespace))
}

// KubeClient is the in-memory Kubernetes client Istio watches, for objects
// the typed helpers do not cover.
func (c *ControlPlane) KubeClient() kubelib.Client { return c.fake.KubeClient() }

// ApplyNamespace creates or updates a Namespace.
func (c *ControlPlane) ApplyNamespace(ns *corev1.Namespace) error {
	return apply("namespace", c.fake.KubeClient().Kube().CoreV1().Namespaces(), ns)
}

// ApplyPod creates or updates a Pod, then writes its status (IP, phase,
// readiness) as the kubelet would.
func (c *ControlPlane) ApplyPod(pod *corev1.Pod) error {
	api := c.fake.KubeClient().Kube().CoreV1().Pods(pod.Namespace)
	if err := apply("pod", api, pod); err != nil {
		return err
	}
	if _, err := api.UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("controlplane: pod %s/%s status: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// DeletePod deletes a Pod.
func (c *ControlPlane) DeletePod(namespace, name string) error {
	return remove("pod", namespace, name, c.fake.KubeClient().Kube().CoreV1().Pods(namespace))
}

// ApplyService creates or updates a Service.
func (c *ControlPlane) ApplyService(svc *corev1.Service) error {
	return apply("service", c.fake.KubeClient().Kube().CoreV1().Services(svc.Namespace), svc)
}

// DeleteService deletes a Service.
func (c *ControlPlane) DeleteService(namespace, name string) error {
	return remove("service", namespace, name, c.fake.KubeClient().Kube().CoreV1().Services(namespace))
}

// ApplyWorkloadEntry creates or updates a WorkloadEntry
// (networking.istio.io/v1).
func (c *ControlPlane) ApplyWorkloadEntry(we *networkingv1.WorkloadEntry) error {
	return apply("workloadentry", c.fake.KubeClient().Istio().NetworkingV1().WorkloadEntries(we.Namespace), we)
}

// DeleteWorkloadEntry deletes a WorkloadEntry.
func (c *ControlPlane) DeleteWorkloadEntry(namespace, name string) error {
	return remove("workloadentry", namespace, name,
		c.fake.KubeClient().Istio().NetworkingV1().WorkloadEntries(namespace))
}

// ApplyAuthorizationPolicy creates or updates an AuthorizationPolicy
// (security.istio.io/v1).
func (c *ControlPlane) ApplyAuthorizationPolicy(p *securityv1.AuthorizationPolicy) error {
	return apply("authorizationpolicy", c.fake.KubeClient().Istio().SecurityV1().AuthorizationPolicies(p.Namespace), p)
}

// DeleteAuthorizationPolicy deletes an AuthorizationPolicy.
func (c *ControlPlane) DeleteAuthorizationPolicy(namespace, name string) error {
	return remove("authorizationpolicy", namespace, name,
		c.fake.KubeClient().Istio().SecurityV1().AuthorizationPolicies(namespace))
}

// ApplyYAML applies every document of a Kubernetes YAML stream: Namespaces,
// Pods (with their status), Services, WorkloadEntries and
// AuthorizationPolicies. A document without a namespace goes to "default".
// It stops at the first document it cannot apply and says which one.
func (c *ControlPlane) ApplyYAML(data []byte) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("controlplane: yaml document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, gvk, err := kubelib.IstioCodec.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return fmt.Errorf("controlplane: yaml document %d: %w", i, err)
		}
		if m, ok := obj.(metav1.Object); ok && m.GetNamespace() == "" {
			if _, isNS := obj.(*corev1.Namespace); !isNS {
				m.SetNamespace("default")
			}
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			err = c.ApplyNamespace(o)
		case *corev1.Pod:
			err = c.ApplyPod(o)
		case *corev1.Service:
			err = c.ApplyService(o)
		case *networkingv1.WorkloadEntry:
			err = c.ApplyWorkloadEntry(o)
		case *securityv1.AuthorizationPolicy:
			err = c.ApplyAuthorizationPolicy(o)
		default:
			err = fmt.Errorf("kind %s is not one the harness applies", gvk.Kind)
		}
		if err != nil {
			return fmt.Errorf("controlplane: yaml document %d: %w", i, err)
		}
	}
}

// writer is the part of a typed Kubernetes client apply uses.
type writer[T metav1.Object] interface {
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// deleter is the part of a typed Kubernetes client remove uses.
type deleter interface {
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// apply creates obj, or updates it if it exists. The in-memory client
// answers at once, so a background context is enough.
func apply[T metav1.Object](kind string, api writer[T], obj T) error {
	ctx := context.Background()
	_, err := api.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = api.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		key := obj.GetName()
		if ns := obj.GetNamespace(); ns != "" {
			key = ns + "/" + key
		}
		return fmt.Errorf("controlplane: %s %s: %w", kind, key, err)
	}
	return nil
}

func remove(kind, namespace, name string, api deleter) error {
	if err := api.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("controlplane: delete %s %s/%s: %w", kind, namespace, name, err)
	}
	return nil
}
