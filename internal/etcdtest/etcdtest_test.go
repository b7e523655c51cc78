package etcdtest_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ingestorhq/ingestor/internal/etcdtest"
)

// TestEtcdServerKeepsKeysAcrossRestart writes a key through etcd's v3
// JSON gateway, stops and restarts the server, and reads the key back.
func TestEtcdServerKeepsKeysAcrossRestart(t *testing.T) {
	s := etcdtest.Start(t)
	b64 := base64.StdEncoding.EncodeToString
	call(t, s.Endpoint+"/v3/kv/put", fmt.Sprintf(`{"key":%q,"value":%q}`, b64([]byte("/ingestor/t/k")), b64([]byte("v1"))))
	s.Stop()
	if _, err := http.Post(s.Endpoint+"/v3/kv/range", "application/json", strings.NewReader(`{}`)); err == nil {
		t.Fatal("a stopped server answered")
	}
	s.Restart()
	var got struct {
		KVs []struct{ Value string } `json:"kvs"`
	}
	if err := json.Unmarshal(call(t, s.Endpoint+"/v3/kv/range", fmt.Sprintf(`{"key":%q}`, b64([]byte("/ingestor/t/k")))), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.KVs) != 1 || got.KVs[0].Value != b64([]byte("v1")) {
		t.Fatalf("after a restart the key reads %+v, want v1", got.KVs)
	}
}

func call(t *testing.T, url, body string) []byte {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s %s %v", url, resp.Status, b, err)
	}
	return b
}
