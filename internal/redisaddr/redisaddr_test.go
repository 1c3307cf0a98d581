package redisaddr

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	opt, err := Parse("127.0.0.1:6379")
	if err != nil || len(opt.InitAddress) != 1 || opt.Username != "" || opt.TLSConfig != nil {
		t.Fatalf("%+v %v", opt, err)
	}
	opt, err = Parse("a:1, b:2")
	if err != nil || len(opt.InitAddress) != 2 {
		t.Fatalf("%+v %v", opt, err)
	}
	opt, err = Parse("redis://shop-svc:s%40cret@127.0.0.1:6380/0")
	if err != nil || opt.Username != "shop-svc" || opt.Password != "s@cret" || opt.InitAddress[0] != "127.0.0.1:6380" || opt.TLSConfig != nil {
		t.Fatalf("%+v %v", opt, err)
	}
	opt, err = Parse("rediss://u:p@cache.example:6380")
	if err != nil || opt.TLSConfig == nil || opt.Username != "u" || opt.Password != "p" {
		t.Fatalf("rediss: %+v %v", opt, err)
	}
	for _, bad := range []string{"", "nohost", "redis://u:secret@host:6379/notadb", "ftp://u:secret@x"} {
		_, err := Parse(bad)
		if err == nil {
			t.Errorf("%q: no error", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", bad, err)
		}
	}
	if got := Redact("redis://u:secret@h:1"); got != "redis://u:xxxxx@h:1" {
		t.Errorf("Redact: %s", got)
	}
}

func TestParseSentinel(t *testing.T) {
	opt, err := ParseSentinel("stock@10.0.0.1:26379, 10.0.0.2:26379,10.0.0.3:26379")
	if err != nil || opt.Sentinel.MasterSet != "stock" || len(opt.InitAddress) != 3 || opt.InitAddress[1] != "10.0.0.2:26379" {
		t.Fatalf("%+v %v", opt, err)
	}
	opt, err = ParseSentinel("mymaster@[::1]:26379")
	if err != nil || opt.Sentinel.MasterSet != "mymaster" || opt.InitAddress[0] != "[::1]:26379" {
		t.Fatalf("%+v %v", opt, err)
	}
	for _, bad := range []string{"", "stock", "@a:1", "stock@", "stock@nohost", "a b@h:1", "stock@h:1,x",
		// each was once accepted, to fail later as a connection error
		"stock@h:1,h:1", "stock@h:1,,h:2", "stock@h:1,", "stock@,h:1", "stock@h:abc", "stock@h:99999",
		"stock@h:0", "stock@h:-1", "stock@:1", "st@ck@h:1", "stock@h x:1"} {
		if _, err := ParseSentinel(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
