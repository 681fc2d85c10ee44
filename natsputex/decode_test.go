package natsputex

import (
	"encoding/base64"
	"testing"
)

// FuzzDecodeRecord feeds JetStream message-get answers, real and mangled,
// to the decoder: it must give a record or an error, never panic, and a
// record it gives must be consistent (a live key has a revision; a missing
// or deleted one has no holder).
func FuzzDecodeRecord(f *testing.F) {
	hdr := base64.StdEncoding.EncodeToString([]byte("NATS/1.0\r\nKV-Operation: DEL\r\n\r\n"))
	for _, seed := range []string{
		`{"message":{"subject":"$KV.b.k","seq":7,"data":"bm9kZS1h","time":"2026-01-01T00:00:00Z"}}`,
		`{"message":{"seq":9,"hdrs":"` + hdr + `","data":""}}`,
		`{"error":{"code":404,"err_code":10037,"description":"no message found"}}`,
		`{"error":{"code":503,"err_code":10039,"description":"jetstream not enabled"}}`,
		`{"message":null}`, `{"message":{"seq":0}}`, `{"message":{"seq":1,"hdrs":"AAAA"}}`,
		`{}`, `[]`, `null`, ``, `{"message":{"seq":-1}}`, `{"message":{"seq":1,"data":"!!"}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRecord("k", data)
		if err != nil {
			if r != (record{}) {
				t.Fatalf("an error with a record: %+v, %v", r, err)
			}
			return
		}
		if r.exists && r.rev == 0 {
			t.Fatalf("a live key without a revision: %+v", r)
		}
		if !r.exists && r.holder != "" {
			t.Fatalf("a missing key with a holder: %+v", r)
		}
	})
}
