package controlplane

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// Audience is the audience istiod asks the TokenReview for (Istio's
// TOKEN_AUDIENCES default), so a token must carry it to be accepted.
const Audience = "istio-ca"

// tokenLifetime is the exp claim written into issued tokens; the review does
// not enforce it (tests revoke by not issuing), it only keeps the JWT shape.
const tokenLifetime = 24 * time.Hour

// tokenIdentity is what the TokenReview answers for a token it issued.
type tokenIdentity struct {
	namespace      string
	serviceAccount string
	audiences      []string
	uid            string
}

// tokens is the harness's service-account token issuer and the TokenReview
// behind it: only tokens issued here are authenticated, and only for a
// review whose audiences intersect the token's.
type tokens struct {
	dir string

	mu     sync.Mutex
	issued map[string]tokenIdentity
	files  int
}

func newTokens(dir string) *tokens {
	return &tokens{dir: dir, issued: map[string]tokenIdentity{}}
}

// issue makes a JWT-shaped token for namespace/serviceAccount with the given
// audiences, records it for review, writes it to a new file and returns the
// file's path.
func (t *tokens) issue(namespace, serviceAccount string, audiences []string) (string, error) {
	if namespace == "" || serviceAccount == "" {
		return "", fmt.Errorf("controlplane: token: namespace and service account are required")
	}
	uid, err := randomText(16)
	if err != nil {
		return "", fmt.Errorf("controlplane: token: %w", err)
	}
	now := time.Now()
	claims := map[string]any{
		"aud": audiences,
		"exp": now.Add(tokenLifetime).Unix(),
		"iat": now.Unix(),
		"nbf": now.Unix(),
		"iss": "https://kubernetes.default.svc.cluster.local",
		"sub": "system:serviceaccount:" + namespace + ":" + serviceAccount,
		"kubernetes.io": map[string]any{
			"namespace":      namespace,
			"serviceaccount": map[string]string{"name": serviceAccount, "uid": uid},
		},
	}
	token, err := jwtShape(claims)
	if err != nil {
		return "", fmt.Errorf("controlplane: token: %w", err)
	}
	id := tokenIdentity{namespace: namespace, serviceAccount: serviceAccount, audiences: audiences, uid: uid}
	return t.write(token, &id)
}

// unknown writes a well-formed token that was never issued, so the review
// refuses it.
func (t *tokens) unknown() (string, error) {
	token, err := jwtShape(map[string]any{
		"aud": []string{Audience},
		"sub": "system:serviceaccount:nowhere:nobody",
		"exp": time.Now().Add(tokenLifetime).Unix(),
	})
	if err != nil {
		return "", fmt.Errorf("controlplane: token: %w", err)
	}
	return t.write(token, nil)
}

func (t *tokens) write(token string, id *tokenIdentity) (string, error) {
	t.mu.Lock()
	t.files++
	path := filepath.Join(t.dir, fmt.Sprintf("token-%d", t.files))
	if id != nil {
		t.issued[token] = *id
	}
	t.mu.Unlock()
	if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
		return "", fmt.Errorf("controlplane: token: %w", err)
	}
	return path, nil
}

// review answers a TokenReview create the way the API server does for
// service-account tokens.
func (t *tokens) review(action k8stesting.Action) (bool, runtime.Object, error) {
	create, ok := action.(k8stesting.CreateAction)
	if !ok {
		return false, nil, nil
	}
	in, ok := create.GetObject().(*authv1.TokenReview)
	if !ok {
		return false, nil, nil
	}
	out := in.DeepCopy()
	t.mu.Lock()
	id, known := t.issued[in.Spec.Token]
	t.mu.Unlock()
	if !known {
		out.Status = authv1.TokenReviewStatus{Authenticated: false, Error: "invalid bearer token"}
		return true, out, nil
	}
	var matched []string
	for _, want := range in.Spec.Audiences {
		if slices.Contains(id.audiences, want) {
			matched = append(matched, want)
		}
	}
	if len(in.Spec.Audiences) > 0 && len(matched) == 0 {
		out.Status = authv1.TokenReviewStatus{Authenticated: false, Error: "token audiences are invalid"}
		return true, out, nil
	}
	out.Status = authv1.TokenReviewStatus{
		Authenticated: true,
		Audiences:     matched,
		User: authv1.UserInfo{
			Username: "system:serviceaccount:" + id.namespace + ":" + id.serviceAccount,
			UID:      id.uid,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + id.namespace, "system:authenticated"},
		},
	}
	return true, out, nil
}

// jwtShape encodes claims as an unsigned-looking JWT (header.claims.random):
// the review looks tokens up, it never verifies a signature.
func jwtShape(claims map[string]any) (string, error) {
	header, err := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT"})
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	sig, err := randomText(32)
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	return enc.EncodeToString(header) + "." + enc.EncodeToString(body) + "." + sig, nil
}

func randomText(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
