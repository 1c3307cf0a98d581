package redisaddr

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	opt, err := Parse("127.0.0.1:6379")
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1:6379"}, opt.InitAddress)
	assert.Empty(t, opt.Username)
	assert.Nil(t, opt.TLSConfig)
	opt, err = Parse("a:1, b:2")
	require.NoError(t, err)
	assert.Len(t, opt.InitAddress, 2)
	opt, err = Parse("redis://shop-svc:s%40cret@127.0.0.1:6380/0")
	require.NoError(t, err)
	assert.Equal(t, []string{"shop-svc", "s@cret", "127.0.0.1:6380"}, []string{opt.Username, opt.Password, opt.InitAddress[0]})
	assert.Nil(t, opt.TLSConfig)
	opt, err = Parse("rediss://u:p@cache.example:6380")
	require.NoError(t, err, "rediss")
	assert.NotNil(t, opt.TLSConfig, "rediss")
	assert.Equal(t, []string{"u", "p"}, []string{opt.Username, opt.Password}, "rediss")
	for _, bad := range []string{"", "nohost", "redis://u:secret@host:6379/notadb", "ftp://u:secret@x"} {
		_, err := Parse(bad)
		if assert.Error(t, err, bad) {
			assert.NotContains(t, err.Error(), "secret", "%q: the error shows the password", bad)
		}
	}
	assert.Equal(t, "redis://u:xxxxx@h:1", Redact("redis://u:secret@h:1"))
}

func TestParseSentinel(t *testing.T) {
	opt, err := ParseSentinel("stock@10.0.0.1:26379, 10.0.0.2:26379,10.0.0.3:26379")
	require.NoError(t, err)
	assert.Equal(t, "stock", opt.Sentinel.MasterSet)
	assert.Equal(t, []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"}, opt.InitAddress)
	opt, err = ParseSentinel("mymaster@[::1]:26379")
	require.NoError(t, err)
	assert.Equal(t, "mymaster", opt.Sentinel.MasterSet)
	assert.Equal(t, "[::1]:26379", opt.InitAddress[0])
	for _, bad := range []string{"", "stock", "@a:1", "stock@", "stock@nohost", "a b@h:1", "stock@h:1,x",
		// each was once accepted, to fail later as a connection error
		"stock@h:1,h:1", "stock@h:1,,h:2", "stock@h:1,", "stock@,h:1", "stock@h:abc", "stock@h:99999",
		"stock@h:0", "stock@h:-1", "stock@:1", "st@ck@h:1", "stock@h x:1"} {
		_, err := ParseSentinel(bad)
		assert.Error(t, err, bad)
	}
}
