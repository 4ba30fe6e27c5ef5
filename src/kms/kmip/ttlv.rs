//! The `kmip` provider's messages in TTLV: requests built from `kmip-protocol`'s types, the
//! serde mirrors of the Get response and the Register request (see `mod.rs`'s module
//! documentation for why), the batch items of a reply, and why one exchange failed ([`Fail`]).

use kmip_protocol::types::common::{Operation, UniqueBatchItemID};
use kmip_protocol::types::request::{
    Authentication, BatchCount, BatchItem, MaximumResponseSize, RequestHeader, RequestMessage,
    RequestPayload,
};
use kmip_protocol::types::response::{
    ResponseMessage, ResponsePayload, ResultReason, ResultStatus,
};
use zeroize::Zeroizing;

use crate::kms::KmsError;

/// Why one KMIP exchange failed.
pub(super) enum Fail {
    /// Network or TLS failure, already mapped (the request may or may not have been executed).
    Transport(KmsError),
    /// The server answered Operation Failed.
    Server {
        reason: Option<ResultReason>,
        message: String,
    },
    /// The answer was not a KMIP response keyplan understands.
    Protocol(String),
    /// keyplan could not build the request.
    Local(String),
}

/// The TTLV encoding of a one-item request message carrying `payload`, and its operation.
pub(super) fn request(payload: RequestPayload) -> Result<(Operation, Zeroizing<Vec<u8>>), Fail> {
    let op = payload.operation();
    let msg = RequestMessage(
        RequestHeader(
            payload.protocol_version(),
            Option::<MaximumResponseSize>::None,
            Option::<Authentication>::None,
            BatchCount(1),
        ),
        vec![BatchItem(op, Option::<UniqueBatchItemID>::None, payload)],
    );
    Ok((op, encode(&msg)?))
}

/// TTLV encoding of a request into a zeroizing buffer.
pub(super) fn encode<T: serde::Serialize>(msg: &T) -> Result<Zeroizing<Vec<u8>>, Fail> {
    kmip_ttlv::to_vec(msg)
        .map(Zeroizing::new)
        .map_err(|e| Fail::Local(format!("cannot encode the KMIP request: {e}")))
}

/// One batch item of a reply, whatever its payload type.
pub(super) struct ItemParts<P> {
    pub(super) operation: Option<Operation>,
    pub(super) status: ResultStatus,
    pub(super) reason: Option<ResultReason>,
    pub(super) message: Option<String>,
    pub(super) payload: Option<P>,
}

/// A KMIP response message type keyplan decodes.
pub(super) trait Reply: serde::de::DeserializeOwned {
    /// The payload of a successful batch item.
    type Payload;
    /// The batch items.
    fn into_items(self) -> Vec<ItemParts<Self::Payload>>;
}

impl Reply for ResponseMessage {
    type Payload = ResponsePayload;
    fn into_items(self) -> Vec<ItemParts<ResponsePayload>> {
        self.batch_items
            .into_iter()
            .map(|i| ItemParts {
                operation: i.operation,
                status: i.result_status,
                reason: i.result_reason,
                message: i.result_message,
                payload: i.payload,
            })
            .collect()
    }
}

impl Reply for reply::GetMessage {
    type Payload = reply::GetPayload;
    fn into_items(self) -> Vec<ItemParts<reply::GetPayload>> {
        self.batch_items
            .into_iter()
            .map(|i| ItemParts {
                operation: i.operation,
                status: i.result_status,
                reason: i.result_reason,
                message: i.result_message,
                payload: i.payload,
            })
            .collect()
    }
}

/// The Get response as a serde mirror of `kmip-protocol`'s response types (same tags, same
/// field order), reduced to a Symmetric Key whose Key Block ends after the Key Value: the
/// crate's own Key Block cannot decode the HMAC-SHA256 algorithm value (0x00000009), and the
/// fields after the Key Value (algorithm, length) are skipped by `kmip-ttlv` when absent from
/// the Rust type. Fields keyplan does not read are still declared: `kmip-ttlv` matches the
/// items of a structure to the fields by position.
#[allow(dead_code)]
pub(super) mod reply {
    use kmip_protocol::types::common::{
        KeyCompressionType, KeyFormatType, KeyMaterial, ObjectType, Operation, UniqueBatchItemID,
        UniqueIdentifier,
    };
    use kmip_protocol::types::response::{
        MessageExtension, ResponseHeader, ResultReason, ResultStatus,
    };
    use serde::Deserialize;

    /// Response Message (tag 0x42007B) of a Get.
    #[derive(Deserialize)]
    #[serde(rename = "0x42007B")]
    pub struct GetMessage {
        #[serde(rename = "0x42007A")]
        pub header: ResponseHeader,
        #[serde(rename = "0x42000F")]
        pub batch_items: Vec<GetItem>,
    }

    /// Batch Item (tag 0x42000F).
    #[derive(Deserialize)]
    #[serde(rename = "0x42000F")]
    pub struct GetItem {
        #[serde(rename = "0x42005C")]
        pub operation: Option<Operation>,
        #[serde(rename = "0x420093")]
        pub unique_batch_item_id: Option<UniqueBatchItemID>,
        #[serde(rename = "0x42007F")]
        pub result_status: ResultStatus,
        #[serde(rename = "0x42007E")]
        pub result_reason: Option<ResultReason>,
        #[serde(rename = "0x42007D")]
        pub result_message: Option<String>,
        #[serde(rename = "0x42007C")]
        pub payload: Option<GetPayload>,
        #[serde(rename = "0x420051")]
        pub message_extension: Option<MessageExtension>,
    }

    /// Get Response Payload (tag 0x42007C).
    #[derive(Deserialize)]
    #[serde(rename = "0x42007C")]
    pub struct GetPayload {
        pub object_type: ObjectType,
        pub unique_identifier: UniqueIdentifier,
        pub object: Object,
    }

    /// The managed object, chosen by the Object Type read before it.
    #[derive(Deserialize)]
    pub enum Object {
        /// Symmetric Key.
        #[serde(rename = "if 0x420057==0x00000002")]
        SymmetricKey(SymmetricKey),
    }

    /// Symmetric Key (tag 0x42008F).
    #[derive(Deserialize)]
    #[serde(rename = "0x42008F")]
    pub struct SymmetricKey {
        pub key_block: KeyBlock,
    }

    /// Key Block (tag 0x420040), up to the Key Value.
    #[derive(Deserialize)]
    #[serde(rename = "0x420040")]
    pub struct KeyBlock {
        #[serde(rename = "0x420042")]
        pub key_format_type: KeyFormatType,
        #[serde(rename = "0x420041")]
        pub key_compression_type: Option<KeyCompressionType>,
        #[serde(rename = "0x420045")]
        pub key_value: KeyValue,
    }

    /// Key Value (tag 0x420045).
    #[derive(Deserialize)]
    #[serde(rename = "0x420045")]
    pub struct KeyValue {
        pub key_material: KeyMaterial,
    }
}

/// The Register request as its own serde mirror of `kmip-protocol`'s types, byte-for-byte the
/// same TTLV (see the unit test), with two differences: the Cryptographic Algorithm may be
/// HMAC-SHA256, which `kmip-protocol` 0.4.3 cannot express, and the key material is borrowed,
/// so the only copy made is the zeroized TTLV buffer.
pub(super) mod wire {
    use kmip_protocol::types::common::{CryptographicLength, KeyFormatType, ObjectType, Operation};
    use kmip_protocol::types::request::{
        Attribute, BatchCount, ProtocolVersion, ProtocolVersionMajor, ProtocolVersionMinor,
        RequestHeader, TemplateAttribute,
    };
    use serde::{Serialize, Serializer};

    /// Request Message (tag 0x420078).
    #[derive(Serialize)]
    #[serde(rename = "0x420078")]
    pub struct Message<'a, A: Serialize>(pub RequestHeader, pub Vec<Item<'a, A>>);

    /// Batch Item (tag 0x42000F).
    #[derive(Serialize)]
    #[serde(rename = "0x42000F")]
    pub struct Item<'a, A: Serialize>(pub Operation, pub Payload<'a, A>);

    /// Register Request Payload (tag 0x420079).
    #[derive(Serialize)]
    #[serde(rename = "0x420079")]
    pub struct Payload<'a, A: Serialize>(pub ObjectType, pub TemplateAttribute, pub Key<'a, A>);

    /// Symmetric Key (tag 0x42008F).
    #[derive(Serialize)]
    #[serde(rename = "0x42008F")]
    pub struct Key<'a, A: Serialize>(pub Block<'a, A>);

    /// Key Block (tag 0x420040).
    #[derive(Serialize)]
    #[serde(rename = "0x420040")]
    pub struct Block<'a, A: Serialize>(
        pub KeyFormatType,
        pub Value<'a>,
        pub A,
        pub CryptographicLength,
    );

    /// Key Value (tag 0x420045).
    #[derive(Serialize)]
    #[serde(rename = "0x420045")]
    pub struct Value<'a>(pub Material<'a>);

    /// Key Material (tag 0x420043) as a byte string.
    #[derive(Serialize)]
    #[serde(rename = "0x420043")]
    pub enum Material<'a> {
        /// Raw bytes.
        #[serde(rename = "Transparent")]
        Bytes(Borrowed<'a>),
    }

    /// Borrowed bytes serialized as a TTLV Byte String.
    pub struct Borrowed<'a>(pub &'a [u8]);

    impl Serialize for Borrowed<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    /// Cryptographic Algorithm (tag 0x420028), KMIP 1.0 §9.1.3.2.13.
    #[derive(Serialize, Clone, Copy)]
    #[serde(rename = "0x420028")]
    pub enum Algorithm {
        /// HMAC-SHA256 (0x00000009): any key length.
        #[serde(rename = "0x00000009")]
        HmacSha256,
    }

    /// The Register request for a Raw Symmetric Key of `bits` bits holding `material`.
    pub fn register<'a, A: Serialize>(
        attrs: Vec<Attribute>,
        material: &'a [u8],
        algorithm: A,
        bits: i32,
    ) -> Message<'a, A> {
        Message(
            RequestHeader(
                ProtocolVersion(ProtocolVersionMajor(1), ProtocolVersionMinor(0)),
                None,
                None,
                BatchCount(1),
            ),
            vec![Item(
                Operation::Register,
                Payload(
                    ObjectType::SymmetricKey,
                    TemplateAttribute::unnamed(attrs),
                    Key(Block(
                        KeyFormatType::Raw,
                        Value(Material::Bytes(Borrowed(material))),
                        algorithm,
                        CryptographicLength(bits),
                    )),
                ),
            )],
        )
    }
}
