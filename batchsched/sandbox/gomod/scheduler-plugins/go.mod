// Wrapper module that pins scheduler-plugins' scheduler (Coscheduling and the other
// out-of-tree plugins) for batchsched's perf suite. v0.34.7 is the newest release the Go
// module proxy serves; it is built against Kubernetes v1.34.7 (two minor versions behind
// the sandbox's v1.36.3 apiserver: it only uses GA APIs plus its own CRDs). The replace
// lines repeat the upstream module's own, which do not apply to a dependency.
module batchsched.local/sandbox/scheduler-plugins

go 1.26.0

require sigs.k8s.io/scheduler-plugins v0.34.7

replace (
	k8s.io/api => k8s.io/api v0.34.7
	k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.34.7
	k8s.io/apimachinery => k8s.io/apimachinery v0.34.7
	k8s.io/apiserver => k8s.io/apiserver v0.34.7
	k8s.io/cli-runtime => k8s.io/cli-runtime v0.34.7
	k8s.io/client-go => k8s.io/client-go v0.34.7
	k8s.io/cloud-provider => k8s.io/cloud-provider v0.34.7
	k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.34.7
	k8s.io/code-generator => k8s.io/code-generator v0.34.7
	k8s.io/component-base => k8s.io/component-base v0.34.7
	k8s.io/component-helpers => k8s.io/component-helpers v0.34.7
	k8s.io/controller-manager => k8s.io/controller-manager v0.34.7
	k8s.io/cri-api => k8s.io/cri-api v0.34.7
	k8s.io/cri-client => k8s.io/cri-client v0.34.7
	k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.34.7
	k8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation v0.34.7
	k8s.io/endpointslice => k8s.io/endpointslice v0.34.7
	k8s.io/kms => k8s.io/kms v0.34.7
	k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.34.7
	k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.34.7
	k8s.io/kube-proxy => k8s.io/kube-proxy v0.34.7
	k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.34.7
	k8s.io/kubectl => k8s.io/kubectl v0.34.7
	k8s.io/kubelet => k8s.io/kubelet v0.34.7
	k8s.io/kubernetes => k8s.io/kubernetes v1.34.7
	k8s.io/legacy-cloud-providers => k8s.io/legacy-cloud-providers v0.31.8
	k8s.io/metrics => k8s.io/metrics v0.34.7
	k8s.io/mount-utils => k8s.io/mount-utils v0.34.7
	k8s.io/pod-security-admission => k8s.io/pod-security-admission v0.34.7
	k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.34.7
	k8s.io/externaljwt => k8s.io/externaljwt v0.34.7
	k8s.io/sample-cli-plugin => k8s.io/sample-cli-plugin v0.34.7
	k8s.io/sample-controller => k8s.io/sample-controller v0.34.7
)
